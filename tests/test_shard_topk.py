"""shard_topk and lm_head_topk: the k best entries per row, in torch.topk order
(NaN first, larger value, smaller index), exact against the float64 reference
on exact data; k and d2t checks. (The shard arguments are checked in
test_shard_argmax_bad_input.py for every fused op.)"""

from __future__ import annotations

import pytest
import torch

import localargmax
from tests.support.checks import BAD_D2T, raises_cleanly
from tests.support.paths import CPU_PATHS, on, path_keyword, use_path
from tests.support.problems import (
    full_bias,
    integer_problem,
    make_shards,
    planted_problem,
    random_problem,
    simulated_topk,
    stack_frames,
)
from tests.support.reference import ref_logits, ref_topk, ref_transform
from tests.support.strategies import d2t_for, exact_problems, given, layouts, settings, st

H, ROWS, B = 8, 6, 3


def test_shard_topk_correctness(gen, path):
    """The same keys as the default CPU kernel (planted data) and the exact
    reference (integer data, ties) on every path; opcheck."""
    hidden, weight, _, _ = planted_problem(gen, 7, 3000, 64, torch.bfloat16)
    for k in (1, 8, 64):
        with use_path(CPU_PATHS[0]):
            cpu = localargmax.shard_topk(hidden, weight, k)
        got = localargmax.shard_topk(*on(path, hidden, weight), k).cpu()
        if path.device == "cpu":  # the CPU variants are bit-identical
            assert torch.equal(got, cpu), k
        else:  # other summation orders: the planted winner, not the keys' value bits
            assert torch.equal(localargmax.decode_keys(got[:, 0])[0], localargmax.decode_keys(cpu[:, 0])[0]), k
    hidden, weight, bias = integer_problem(gen, 6, 300, 13, bias=True)
    keys = localargmax.shard_topk(*on(path, hidden, weight), 16, vocab_start=5, bias=on(path, bias))
    ids, values = localargmax.decode_keys(keys.cpu())
    logits = ref_logits(hidden, weight, bias)
    want = ref_topk(logits, 16)
    assert torch.equal(ids - 5, want) and torch.equal(values.double(), logits.gather(1, want))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        hidden, weight = on(
            path, torch.randn(3, 20, generator=gen).to(dtype), torch.randn(150, 20, generator=gen).to(dtype)
        )
        bias = on(path, torch.randn(150, generator=gen))
        kw = {"path": path_keyword(path, "shard_topk")}
        torch.library.opcheck(torch.ops.localargmax.shard_topk.default, (hidden, weight, None, 10, 140, 5), kw)
        torch.library.opcheck(torch.ops.localargmax.shard_topk.default, (hidden, weight, bias, 0, 150, 64), kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_topk_matches_exact_reference_with_ties_padding_and_empty_shards(gen, dtype, tp):
    vocab = int(torch.randint(70, 400, (1,), generator=gen))
    hidden, weight, _ = integer_problem(gen, 6, vocab, 13, dtype)
    k = int(torch.randint(1, 65, (1,), generator=gen))
    logits = ref_logits(hidden, weight)
    want = ref_topk(logits, k)
    for pad_to in (1, 64, 256):  # 256: later ranks hold only padding for small vocabularies
        ids, values = simulated_topk(hidden, make_shards(weight, None, tp, pad_to, hidden=hidden), k)
        assert torch.equal(ids, want), (pad_to, k)
        assert torch.equal(values.double(), logits.gather(1, want))


def test_topk_nan_bias_and_d2t(gen):
    hidden, weight, _ = integer_problem(gen, 4, 300, 9)
    bias = torch.randint(-2, 3, (300,), generator=gen).float()
    bias[[17, 250]] = float("nan")  # NaN logits on two ranks: both first, smaller index first
    d2t = localargmax.build_d2t(torch.rand(1000, generator=gen), 300)
    ids, values = simulated_topk(hidden, make_shards(weight, bias, 3, 64, hidden=hidden), 8, d2t=d2t)
    want = ref_topk(ref_logits(hidden, weight, bias), 8)
    assert torch.equal(ids, want + d2t[want])
    assert ids[:, :2].tolist() == [[17 + int(d2t[17]), 250 + int(d2t[250])]] * 4 and values[:, :2].isnan().all()


@settings(max_examples=600, deadline=None)
@given(p=exact_problems(max_vocab=200), layout=layouts(), k_frac=st.floats(0, 1), use_d2t=st.booleans())
def test_lm_head_topk_exact(p, layout, k_frac, use_d2t):
    """Exact order and values on exact data over random layouts and padding fills."""
    tp, pad_to, pad = layout
    vocab = p.weight.shape[0]
    if p.hidden.shape[0] == 0:
        return  # B = 0: test_step.py::test_empty_batch_everywhere
    k = 1 + int(k_frac * (min(vocab, localargmax.MAX_TOPK) - 1))
    shards = make_shards(p.weight, p.bias, tp, pad_to, hidden=p.hidden, pad=pad)
    logits = ref_logits(p.hidden, p.weight, full_bias(p.bias, shards, vocab))
    want = ref_topk(logits, k)
    d2t = d2t_for(k, vocab) if use_d2t else None
    ids, values = simulated_topk(p.hidden, shards, k, d2t=d2t)
    assert torch.equal(ids, want if d2t is None else want + d2t[want]), p
    got, exact = values, logits.gather(1, want).float()
    assert bool(((got.isnan() & exact.isnan()) | (got == exact)).all()), p


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("k", [0, 65, -1, 1.5, True, "3", None])
@pytest.mark.parametrize("fn", [localargmax.shard_topk, localargmax.lm_head_topk], ids=["shard_topk", "lm_head_topk"])
def test_topk_rejects_bad_k(fn, k):
    raises_cleanly(ValueError, "k must be an int in \\[1, 64\\]", fn, torch.randn(B, H), torch.randn(ROWS, H), k)


def test_lm_head_topk_k_past_valid_vocabulary():
    h, w = torch.randn(B, H), torch.randn(ROWS, H)
    raises_cleanly(ValueError, "exceeds the valid vocabulary", localargmax.lm_head_topk, h, w, ROWS + 1)
    raises_cleanly(ValueError, "exceeds the valid vocabulary", localargmax.lm_head_topk, h, w, 3, num_valid=2)
    keys = stack_frames(  # 2 valid entries in total
        [localargmax.shard_topk(h, w, 4, num_valid=1, vocab_start=r) for r in range(2)], [(0, 1), (1, 1)]
    )
    raises_cleanly(
        ValueError, "exceeds the valid vocabulary", localargmax.lm_head_topk, h, w, 4, num_valid=1, group=lambda k: keys
    )


@pytest.mark.parametrize("case", list(BAD_D2T))
def test_lm_head_topk_rejects_bad_d2t(case):
    """Refused naming d2t (not float ids or a bare IndexError)."""
    d2t, exc = BAD_D2T[case]
    raises_cleanly(exc, "d2t", localargmax.lm_head_topk, torch.randn(B, H), torch.randn(ROWS, H), 2, d2t=d2t)


BAD_OP = {  # raw op calls: (bias, vocab_start, num_valid, k) -> message
    "k0": ((None, 0, ROWS, 0), "k"),
    "k65": ((None, 0, ROWS, 65), "k must be in"),
    "num_valid": ((None, 0, ROWS + 1, 2), "num_valid"),
    "index": ((None, localargmax.MAX_GLOBAL_INDEX, ROWS, 2), "vocab_start|index"),
}


@pytest.mark.parametrize("case", list(BAD_OP))
def test_shard_topk_op_rejects(case):
    """Direct torch.ops calls: the C++ checks raise, never crash."""
    args, word = BAD_OP[case]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=word):
        torch.ops.localargmax.shard_topk.default(torch.randn(B, H), torch.randn(ROWS, H), *args)


def test_shard_topk_log_partition(gen):
    """shard_topk(log_partition=True): the pairs of shard_argmax (bit for
    bit: the same tiles, the same order), keys of the transformed logits
    (without a transform: shard_topk's keys); opcheck."""
    hidden, weight, bias = random_problem(gen, 6, 700, 24, torch.bfloat16, bias="float32")
    for scale, cap in ((1.0, None), (2.0, 1.5)):
        kw = dict(bias=bias, num_valid=690, log_partition=True, scale=scale, soft_cap=cap)
        keys, pairs = localargmax.shard_topk(hidden, weight, 9, **kw)
        top1, pairs1 = localargmax.shard_argmax(hidden, weight, **kw)
        assert torch.equal(keys[:, 0], top1) and torch.equal(pairs.view(torch.int32), pairs1.view(torch.int32))
        if cap is None:
            assert torch.equal(keys, localargmax.shard_topk(hidden, weight, 9, bias=bias, num_valid=690))
        x = ref_transform(ref_logits(hidden, weight[:690], bias[:690]), scale, cap)
        values = localargmax.decode_keys(keys)[1].double()
        assert float((values - x.topk(9, dim=1).values).abs().max()) <= 1e-5
    op = torch.ops.localargmax.shard_topk_lse.default
    torch.library.opcheck(op, (hidden, weight, None, 10, 640, 5), {"path": "generic"})
    torch.library.opcheck(op, (hidden, weight, bias, 0, 700, 64, 0.5, 2.0))
