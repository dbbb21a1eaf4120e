"""shard_argmax, the fused kernel: one correctness body and opcheck on every
kernel path; DESIGN.md's rules 1-5 (ties, NaN, all -inf, padding, identical
rows); the fault families of the kernel (padding that would win, cross-block
reduction, ISA variants and threads, indices past 2**24, near-ties); the CUDA
paths' hard cases; the argument checks of every fused op (shared by all six
entry points) and the C++ emulation test of the tensor-core fragment map."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from localargmax.reference import reference_argmax, reference_logits
from tests.support.checks import raises_cleanly
from tests.support.cpp import check_cpp_test, needs_gxx, run_against_mutation
from tests.support.keys import pack_key, same_float32, to_int64
from tests.support.paths import (
    CPU_PATHS,
    KernelPath,
    cuda_only,
    each_cpu_path_and_thread_count,
    each_cuda_path,
    on,
    path_keyword,
    use_path,
)
from tests.support.problems import (
    PAD_KINDS,
    full_bias,
    integer_problem,
    make_shards,
    planted_problem,
    random_problem,
    shard_keys,
    sharded_argmax,
    simulated_argmax,
    simulated_topk,
)
from tests.support.reference import (
    check_against_reference,
    error_bound,
    min_gap,
    ref_argmax,
    ref_logits,
    ref_topk,
    ref_transform,
    reference_logits_and_error,
)
from tests.support.strategies import exact_problems, given, settings, st

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["f32", "bf16", "f16"]
BIASES = [None, "float32", "weight"]
BIAS_IDS = ["nobias", "bias_f32", "bias_wdtype"]
HALF = [torch.bfloat16, torch.float16]


def _randint(gen, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def _ids(hidden, weight, **kw):
    return localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, **kw))[0].cpu()


def _blas_reference(hidden, weight, bias=None):
    """:func:`reference_logits_and_error` with the float64 logits of a BLAS
    matmul (fast at large H; its rounding, ~1e-16 relative, is far below the
    float32 bound), for ``check_against_reference(reference=...)``."""
    logits = reference_logits(hidden, weight, bias)
    err = error_bound(hidden, weight, bias)
    return logits, torch.where(torch.isfinite(logits), err, torch.zeros_like(err))


# ----------------------------------------------------------------------------- one body, every path


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_shard_argmax_correctness(gen, path, dtype):
    """Planted winners, every tp / padding layout, against the float64
    reference; the same keys as the default CPU kernel; opcheck."""
    cuda = path.device == "cuda"
    for hsize in (1, 2, 3, 31, 33, 127, 129, 4095, 4097) if cuda else (1, 3, 33):
        for batch, vocab in [(1, 1), (3, 129), (17, 1001)] + ([(64, 20000)] if cuda else []):
            hidden, weight, _ = random_problem(gen, batch, vocab, hsize, dtype)
            winners = torch.randint(0, vocab, (batch,), generator=gen)
            weight[winners] = (hidden.float() * 3).to(dtype)
            bias = torch.randn(vocab, generator=gen) * 0.01
            # a plant 3|h|^2 need not win for small H: judged against float64 with the float32 error bound
            reference = _blas_reference(hidden, weight, bias)
            for tp in (1, 3):
                ids, _ = sharded_argmax(on(path, hidden), weight, bias, tp=tp, pad="nan" if tp == 3 else "huge")
                ctx = f"{path} H={hsize} B={batch} V={vocab} tp={tp}"
                check_against_reference(
                    ids, hidden, weight, bias, min_clear_fraction=0.8, context=ctx, reference=reference
                )
            with use_path(CPU_PATHS[0]):
                cpu = localargmax.shard_argmax(hidden, weight, vocab_start=123, bias=bias)
            assert torch.equal(
                localargmax.shard_argmax(*on(path, hidden, weight), vocab_start=123, bias=on(path, bias)).cpu(), cpu
            )
    hidden, weight = on(path, torch.randn(5, 19, generator=gen).to(dtype), torch.randn(70, 19, generator=gen).to(dtype))
    bias32, biasw = on(path, torch.randn(70, generator=gen), torch.randn(70, generator=gen).to(dtype))
    for args in [
        (hidden, weight, None, 0, 70),
        (hidden, weight, bias32, 1000, 65),
        (hidden, weight, biasw, 7, 0),
        (hidden[:0], weight, None, 0, 3),
    ]:
        torch.library.opcheck(torch.ops.localargmax.shard_argmax.default, args, {"path": path_keyword(path)})


# ----------------------------------------------------------------------------- random and planted data


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=BIAS_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 33, 100])
def test_random_single_shard_vs_reference(gen, dtype, bias, hsize):
    """Pure random data, one shard at a random vocab_start: clear winners must
    match exactly, other rows only within the float32 error bound; the decoded
    value is the winner's logit within the bound."""
    for _ in range(3):
        batch, vocab, vocab_start = _randint(gen, 1, 37), _randint(gen, 1, 3000), _randint(gen, 0, 10**6)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=b))
        ctx = f"B={batch} V={vocab} H={hsize} start={vocab_start}"
        check_against_reference(ids - vocab_start, hidden, weight, b, min_clear_fraction=0.85, context=ctx)
        rows = torch.arange(batch)
        exact = ref_logits(hidden, weight, b)[rows, ids - vocab_start]
        tol = error_bound(hidden, weight, b)[rows, ids - vocab_start]
        assert bool(((values.double() - exact).abs() <= tol + 1e-300).all()), ctx


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=BIAS_IDS)
@pytest.mark.parametrize("hsize", [33, 100, 256])
def test_planted_winners_match_exactly(gen, dtype, bias, hsize):
    """One planted winner per batch row, clear by a wide margin: the sharded
    result (every tp / pad_to layout) equals the float64 reference exactly."""
    batch = _randint(gen, 1, 64)
    hidden, weight, b, winners = planted_problem(gen, batch, _randint(gen, max(batch, 50), 3000), hsize, dtype, bias)
    assert min_gap(hidden, weight, b) > 0.02  # the planting worked
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to)
            assert torch.equal(ids, winners), f"tp={tp} pad_to={pad_to} B={batch}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("pad", PAD_KINDS)
def test_random_sharded_vs_reference(gen, dtype, pad):
    """Random data over tp = 1..4 shards with padding that would win; H not a
    multiple of 8; vocab not divisible by tp."""
    for _ in range(2):
        hsize = [1, 7, 9, 33, 65][_randint(gen, 0, 4)]
        batch, vocab = _randint(gen, 1, 20), _randint(gen, 1, 2000)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, "float32")
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 8, 64, 128):
                ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to, pad=pad)
                ctx = f"tp={tp} pad_to={pad_to} V={vocab} B={batch} H={hsize}"
                check_against_reference(ids, hidden, weight, b, min_clear_fraction=0.8, context=ctx)


@settings(max_examples=1200, deadline=None)
@given(p=exact_problems(), start_frac=st.floats(0, 1), pad_rows=st.integers(0, 70), pad=st.sampled_from(PAD_KINDS))
def test_shard_argmax_exact(p, start_frac, pad_rows, pad):
    """Exact data, one shard of vocab + pad_rows rows (padding that would win)
    at any vocab_start: the exact id and the exact value."""
    vocab = p.weight.shape[0]
    vocab_start = int(start_frac * (localargmax.MAX_GLOBAL_INDEX - vocab + 1))
    ((w, b, s),) = make_shards(p.weight, p.bias, 1, vocab + pad_rows, hidden=p.hidden, pad=pad)
    assert s.rows == vocab + pad_rows and s.num_valid == vocab
    keys = localargmax.shard_argmax(p.hidden, w, vocab_start=vocab_start, num_valid=vocab, bias=b)
    if p.hidden.shape[0] == 0:
        assert keys.shape == (0,)
        return
    b_full = full_bias(p.bias, [(w, b, s)], vocab)
    want = ref_argmax(p.hidden, p.weight, b_full)
    ids, values = localargmax.decode_keys(keys)
    assert torch.equal(ids, want + vocab_start), p
    exact = ref_logits(p.hidden, p.weight, b_full)[torch.arange(len(want)), want].float()
    assert bool(((values.isnan() & exact.isnan()) | (values == exact)).all()), p


def test_large_rows_many_chunks(gen):
    """Enough rows for many 64-row tiles and parallel chunks, odd batch."""
    hidden, weight, b, winners = planted_problem(gen, 13, 9000, 40, torch.float32, "float32")
    assert torch.equal(_ids(hidden, weight, bias=b), winners)


# ----------------------------------------------------------------------------- rule 1: ties to the smallest index


def _tie_problem(gen, batch, vocab, hsize, dtype, copies):
    """Random lm_head with one winning row u at the global indices ``copies``
    (positive hidden: u wins every batch row by a wide margin)."""
    hidden = (0.5 + torch.rand(batch, hsize, generator=gen)).to(dtype)
    weight = (torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)).to(dtype)
    weight[copies] = (torch.full((hsize,), 10.0 / math.sqrt(hsize)) + 0.1 * torch.randn(hsize, generator=gen)).to(dtype)
    bias = torch.randn(vocab, generator=gen) * 0.1
    bias[copies] = 0.375
    return hidden, weight, bias


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 64])
def test_exact_ties_smallest_index_wins(gen, dtype, hsize):
    vocab, batch = _randint(gen, 300, 1500), _randint(gen, 1, 11)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            # one copy in every non-empty shard, more in each: a tile boundary, the last valid row
            copies = set()
            for s in (localargmax.shard_vocab(vocab, r, tp, pad_to) for r in range(tp)):
                if s.num_valid:
                    copies |= {s.vocab_start + _randint(gen, 0, s.num_valid - 1), s.vocab_start + s.num_valid - 1}
                    if s.num_valid > 64:
                        copies |= {s.vocab_start + 63, s.vocab_start + 64}
            copies = sorted(copies)
            for bias_on in (False, True):
                hidden, weight, bias = _tie_problem(gen, batch, vocab, hsize, dtype, copies)
                bias = bias if bias_on else None
                ids, _ = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to)
                ctx = f"tp={tp} pad_to={pad_to} copies={copies} bias={bias_on}"
                assert ids.tolist() == [copies[0]] * batch, ctx
                assert torch.equal(ref_argmax(hidden, weight, bias), ids), ctx
                cut = copies[0] + 1  # without the first copy the next one wins
                ids2, _ = sharded_argmax(
                    hidden, weight[cut:], None if bias is None else bias[cut:], tp=tp, pad_to=pad_to
                )
                assert ids2.tolist() == [copies[1] - cut] * batch, ctx


def test_ties_merge_independent_of_rank_order(gen):
    """merge_keys takes the smallest index on ties whatever the order of the
    ranks' keys (a non-standard layout where rank 0 holds the higher ids)."""
    row = torch.randn(1, 16, generator=gen)
    hidden = row * (0.5 + torch.rand(6, 1, generator=gen)) + 0.01 * torch.randn(6, 16, generator=gen)
    k_low = localargmax.shard_argmax(hidden, torch.cat([torch.randn(9, 16, generator=gen) * 0.01, row]), vocab_start=10)
    k_high = localargmax.shard_argmax(
        hidden, torch.cat([row, torch.randn(5, 16, generator=gen) * 0.01]), vocab_start=1000
    )
    assert torch.equal(k_high >> 32, k_low >> 32), "identical rows must give identical values (rule 5)"
    for order in ([k_high, k_low], [k_low, k_high], [k_high, k_high, k_low]):
        assert localargmax.merge_keys(torch.stack(order))[0].tolist() == [19] * 6


# ----------------------------------------------------------------------------- rules 2-4: NaN, -inf, padding


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_in_bias_on_several_shards(gen, dtype):
    vocab, batch = _randint(gen, 200, 900), _randint(gen, 1, 9)
    hidden, weight, _ = random_problem(gen, batch, vocab, 24, dtype)
    for tp in (1, 2, 3, 4):
        for bias_dtype in (torch.float32, dtype):
            bias = torch.randn(vocab, generator=gen).to(bias_dtype)
            nans = sorted(set(torch.randint(vocab // 3, vocab, (tp + 1,), generator=gen).tolist()))
            bias[nans] = float("nan")
            ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=64)
            assert ids.tolist() == [nans[0]] * batch and torch.isnan(values).all(), f"tp={tp} nans={nans}"
            assert torch.equal(ref_argmax(hidden, weight, bias), ids)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_from_weights(gen, dtype):
    """An inf weight meets a zero hidden entry (0 * inf = NaN) in some batch
    rows only; other rows get +inf or -inf from it; a NaN weight row poisons
    every batch row; +inf ties go to the smaller index."""
    hidden, weight, _ = random_problem(gen, 8, 700, 12, dtype)
    hidden[:, 0] = torch.tensor([0.0, 1.0, -1.0, 0.0, 2.0, -0.5, 1.0, 0.0]).to(dtype)
    weight[650, 0] = float("inf")  # NaN for rows 0, 3, 7; +inf for 1, 4, 6; -inf for 2, 5
    weight[400, 0] = float("inf")  # same, smaller index
    weight[500, 0] = float("-inf")  # +inf for 2, 5
    weight[520, 0] = float("-inf")
    assert ref_argmax(hidden, weight).tolist() == [400, 400, 500, 400, 400, 500, 400, 400]
    for tp in (1, 2, 3, 4):
        assert torch.equal(sharded_argmax(hidden, weight, None, tp=tp, pad_to=8)[0], ref_argmax(hidden, weight)), tp
    weight[600, 5] = float("nan")  # NaN logit everywhere; 400 still the first NaN for rows 0, 3, 7
    for tp in (1, 3):
        ids, _ = sharded_argmax(hidden, weight, None, tp=tp, pad_to=1)
        assert ids.tolist() == [400, 600, 600, 400, 600, 600, 600, 400]
        assert torch.equal(ids, ref_argmax(hidden, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_all_neg_inf_gives_first_valid_index(gen, dtype):
    vocab = _randint(gen, 1, 500)
    hidden, weight, _ = random_problem(gen, 5, vocab, 10, dtype)
    for bias_dtype in (torch.float32, dtype):
        bias = torch.full((vocab,), float("-inf"), dtype=bias_dtype)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 64, 256):
                for pad in ("huge", "nan", "inf_bias"):
                    ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to, pad=pad)
                    assert ids.tolist() == [0] * 5, f"tp={tp} pad_to={pad_to} fill={pad} V={vocab}"
                    assert (values == float("-inf")).all()
        assert _ids(hidden, weight, vocab_start=123, bias=bias).tolist() == [123] * 5  # one shard, at an offset


@pytest.mark.parametrize("pad", PAD_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_padding_rows_never_win(gen, dtype, pad):
    """Fault family: padding rows that would win (the fill really does win when
    evaluated as vocabulary) never win, for every shard_vocab layout of many
    vocab sizes, tp 1..4 and pad_to values: through shard_argmax + merge_keys,
    lm_head_argmax on simulated ranks (all-gather and all-reduce) and
    lm_head_topk; planted float data as well as exact integer data."""
    layouts = padded = 0
    for vocab in (1, 2, 5, 63, 64, 65, 127, 129, 1000, 1003):
        exact = vocab != 65
        if exact:
            hidden, weight, bias = integer_problem(gen, 5, vocab, 16, dtype, bias=vocab % 2 == 1)
        else:
            hidden, weight, bias, _ = planted_problem(gen, 5, vocab, 40, dtype, "float32")
        k = min(3, vocab)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 3, 64, 128):
                shards = make_shards(weight, bias, tp, pad_to, hidden=hidden, pad=pad)
                b_full = full_bias(bias, shards, vocab)
                want = ref_argmax(hidden, weight, b_full)
                ctx = f"{pad} V={vocab} tp={tp} pad_to={pad_to} layouts={[tuple(s) for *_, s in shards]}"
                layouts += 1
                padded += sum(s.rows - s.num_valid for *_, s in shards)
                assert torch.equal(localargmax.merge_keys(shard_keys(hidden, shards))[0], want), ctx
                if exact:
                    assert torch.equal(simulated_argmax(hidden, shards), want), ctx
                    assert torch.equal(simulated_argmax(hidden, shards, reduce="all_reduce"), want), ctx
                    assert torch.equal(
                        simulated_topk(hidden, shards, k)[0], ref_topk(ref_logits(hidden, weight, b_full), k)
                    ), ctx
                for w, b, s in [sh for sh in shards if sh[2].rows > sh[2].num_valid][:1]:  # read as vocabulary, it wins
                    cheat = _ids(hidden, w, vocab_start=s.vocab_start, num_valid=s.rows, bias=b)
                    assert bool((cheat >= s.vocab_start + s.num_valid).any()), f"{ctx}: the fill would not win"
    print(f"{layouts} layouts, {padded} padding rows that would have won")
    assert padded > 1000


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_shard_keys_are_zero(gen, dtype):
    hidden, weight, _ = random_problem(gen, 7, 64, 9, dtype)
    weight[:] = float("nan")
    for b in (None, torch.full((64,), float("inf"))):
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=5000, num_valid=0, bias=b)
        assert keys.dtype == torch.int64 and keys.shape == (7,) and keys.eq(0).all()
    keys = localargmax.shard_argmax(hidden, weight[:0], vocab_start=0, num_valid=0)  # a [0, H] shard too
    assert keys.shape == (7,) and keys.eq(0).all()
    real = localargmax.shard_argmax(hidden, torch.randn(3, 9, generator=gen).to(dtype), vocab_start=0)
    ids, _ = localargmax.merge_keys(torch.stack([real, keys, keys]))  # zero keys merge without winning
    assert torch.equal(ids, localargmax.decode_keys(real)[0])


def test_vocab_not_divisible_by_tp_has_empty_last_shards(gen):
    """V=10, pad_to=64, tp=4: rank 0 holds everything, ranks 1-3 are all padding."""
    hidden, weight, b = random_problem(gen, 5, 10, 16, torch.float32, "float32")
    shards = make_shards(weight, b, 4, 64, hidden=hidden, pad="nan")
    assert [s.num_valid for _, _, s in shards] == [10, 0, 0, 0]
    keys = shard_keys(hidden, shards)
    assert keys[1:].eq(0).all()
    check_against_reference(localargmax.merge_keys(keys)[0], hidden, weight, b, min_clear_fraction=0.8)


# ----------------------------------------------------------------------------- signed zeros and denormals


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_hidden_ties_at_first_valid_index(gen, dtype):
    """A zero hidden state (padded batch slot): products are -0.0 or +0.0,
    all logits compare equal, so the first valid index wins (torch.argmax)."""
    hidden = torch.zeros((4, 20), dtype=dtype)
    hidden[1] = -0.0
    hidden[2, ::2] = -0.0
    weight = torch.randn(300, 20, generator=gen).to(dtype)
    weight[0] = -weight[0].abs() - 0.5  # row 0: all products -0.0 for hidden +0
    bias = torch.zeros(300)
    bias[::3] = -0.0
    for tp in (1, 2, 3, 4):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad="nan")
        assert ids.tolist() == [0] * 4 and values.view(torch.int32).eq(0).all(), f"tp={tp}: decoded zero is +0.0"
        assert sharded_argmax(hidden, weight, bias, tp=tp, pad_to=1)[0].tolist() == [0] * 4
    assert ref_argmax(hidden, weight).tolist() == [0] * 4


def test_negative_zero_logit_ties_positive_zero():
    """Only a -0.0 and a +0.0 entry: they tie, the smaller index wins, in either order and across shards."""
    hidden, neg, pos = torch.tensor([[1.0]]), torch.tensor([[-0.0]]), torch.tensor([[0.0]])
    k_neg = localargmax.shard_argmax(hidden, neg, vocab_start=3, bias=torch.tensor([-0.0]))
    k_pos = localargmax.shard_argmax(hidden, pos, vocab_start=5)
    assert torch.equal(k_neg >> 32, k_pos >> 32)
    for pair in ([k_neg, k_pos], [k_pos, k_neg]):
        assert localargmax.merge_keys(torch.stack(pair))[0].tolist() == [3]
    pair = [localargmax.shard_argmax(hidden, neg, vocab_start=7), localargmax.shard_argmax(hidden, pos, vocab_start=2)]
    assert localargmax.merge_keys(torch.stack(pair))[0].tolist() == [2]


def test_denormal_logits_pick_the_right_winner(gen):
    """Logits that are float32 denormals: flushing them to zero would make
    everything tie at index 0. Every value is exact, so the decoded value is
    checked bit-exact too."""
    hsize, vocab, h = 8, 200, 2.0**-70
    hidden = torch.full((2, hsize), h)
    hidden[1] = -h
    coeff = torch.randperm(vocab, generator=gen).float() + 1.0  # distinct 1..V
    weight = (coeff * 2.0**-70).view(-1, 1).expand(vocab, hsize).contiguous()
    exact = torch.tensor([coeff.max() * hsize * 2.0**-140, -coeff.min() * hsize * 2.0**-140], dtype=torch.float64)
    for tp in (1, 2, 3):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad="nan")
        assert ids.tolist() == [int(coeff.argmax()), int(coeff.argmin())] == ref_argmax(hidden, weight).tolist()
        assert torch.equal(values.double(), exact) and 0 < abs(float(values[0])) < 1.1754943508222875e-38
    d = 2.0**-149  # H = 1: the smallest denormal weights themselves, both signs, beside -0.0 / +0.0
    w1 = torch.tensor([-d, -0.0, 0.0, d, 3 * d, 2 * d, -2 * d]).view(-1, 1)
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(torch.tensor([[1.0], [-1.0]]), w1))
    assert ids.tolist() == [4, 6] and values.tolist() == [3 * d, 2 * d]


def test_float16_subnormal_weights(gen, path):
    """fp16 subnormal weights (the half -> float conversion's subnormal path):
    the exact winner and its exact value; H >= 8 so the AVX2 path converts
    with F16C and the tail in software."""
    vocab, hsize = 300, 11
    k = torch.randperm(1023, generator=gen)[:vocab] + 1  # distinct subnormal mantissas
    sub = (k.double() * 2.0**-24).to(torch.float16)
    assert bool((sub.float() < 2.0**-14).all()) and bool((sub.double() == k.double() * 2.0**-24).all())
    weight, hidden = torch.zeros((vocab, hsize), dtype=torch.float16), torch.zeros((2, hsize), dtype=torch.float16)
    col = int(torch.randint(0, hsize, (1,), generator=gen))
    weight[:, col], weight[:, (col + 3) % hsize] = sub, -sub
    hidden[0, col], hidden[1, (col + 3) % hsize] = 1.0, 2.0
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(*on(path, hidden, weight)))
    assert ids.cpu().tolist() == ref_argmax(hidden, weight).tolist() == [int(k.argmax()), int(k.argmin())]
    assert values.cpu().double().tolist() == [float(k.max()) * 2.0**-24, -2.0 * float(k.min()) * 2.0**-24]


# ----------------------------------------------------------------------------- rule 5: identical rows, identical logits


def _logit_at(hidden, weight, row, vocab_start=0):
    """The float32 logit of local ``row`` alone: every other row gets bias -inf."""
    bias = torch.full((weight.shape[0],), float("-inf"))
    bias[row] = 0.0
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=bias))
    assert ids.eq(vocab_start + row).all()
    return values


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [5, 8, 37, 300])
def test_identical_rows_identical_logits(gen, dtype, hsize):
    hidden = torch.randn(7, hsize, generator=gen).to(dtype)
    weight = torch.randn(203, hsize, generator=gen).to(dtype)
    u = torch.randn(hsize, generator=gen).to(dtype)
    positions = [0, 1, 3, 4, 62, 63, 64, 65, 127, 128, 199, 200, 201, 202]
    weight[positions] = u
    ref = _logit_at(hidden, weight, positions[0])
    for p in positions[1:]:
        assert same_float32(_logit_at(hidden, weight, p), ref), f"row {p} differs from row {positions[0]}"
    for other_rows, pos, start in ((1, 0, 10**6), (5, 4, 77), (130, 129, 3), (64, 17, 0)):  # other shards
        w = torch.randn(other_rows, hsize, generator=gen).to(dtype)
        w[pos] = u
        assert same_float32(_logit_at(hidden, w, pos, start), ref), f"shard of {other_rows} rows, row {pos}"
    for b in range(7):  # the same hidden row at any batch position gives the same logit
        assert same_float32(_logit_at(hidden[b : b + 1].repeat(6, 1), weight, 64), ref[b].repeat(6)), f"batch row {b}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [29, 40])  # 40: rows read in place (fp32, bf16), blocked by batch size
def test_same_hidden_row_same_key_at_any_batch_position(gen, dtype, hsize):
    """The CPU kernel blocks rows and batch rows differently by batch size
    (8 / 4 rows at batch 1, 3 rows x 4 batch rows and tails of 1-3 above): a
    key must not depend on the blocking."""
    hidden_row = torch.randn(1, hsize, generator=gen).to(dtype)
    weight = torch.randn(517, hsize, generator=gen).to(dtype)
    alone = int(localargmax.shard_argmax(hidden_row, weight)[0])
    for batch in (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13):
        hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
        where = int(torch.randint(0, batch, (1,), generator=gen))
        hidden[where] = hidden_row[0]
        assert int(localargmax.shard_argmax(hidden, weight)[where]) == alone, f"batch={batch} position={where}"


# ----------------------------------------------------------------------------- CPU ISA variants, threads, blocks


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 8, 9, 33, 100])
def test_generic_isa_matches_default(gen, dtype, hsize):
    """Bit-identical keys and per-row logits from both CPU ISA variants, with
    tiny / huge / non-finite values in a few places."""
    rows = 777
    hidden, weight, _ = random_problem(gen, 13, rows, hsize, dtype)
    weight[5, 0], weight[9, -1], hidden[3, 0] = float("inf"), float("nan"), 0.0
    if dtype == torch.float32:
        hidden[4] = hidden[4] * 1e-30
    bias = torch.randn(rows, generator=gen)
    results = []
    for path in (*CPU_PATHS, CPU_PATHS[0]):
        with use_path(path):
            results.append(
                [
                    localargmax.shard_argmax(hidden, weight, num_valid=nv, bias=b)
                    for nv in (rows, 600)
                    for b in (None, bias)
                ]
            )
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r)), "ISA variants differ"
    weight = weight.clone()
    weight[5, 0], weight[9, -1] = 1.0, -1.0
    for row in (0, 1, 5, 9, 63, 64, 600, 776):  # every row's own logit, through the bias trick
        vals = []
        for path in CPU_PATHS:
            with use_path(path):
                vals.append(_logit_at(hidden, weight, row))
        assert same_float32(*vals), f"row {row} logit differs between ISA variants"


HSIZES = (1, 2, 3, 31, 33, 127, 129, 4095, 4097)
ROW_COUNTS = (1, 2, 63, 64, 65, 127, 4095, 4097, 65537, 300000)
MAX_ELEMS = 3_000_000  # rows * H per case, to stay fast


def test_cross_block_planted_winner(gen):
    """Fault family, cross-block reduction: the winner planted at the first
    row, last row, tile boundaries (64-row tiles) and deep inside, for every
    hidden width and shard height; a tie with a later copy (another tile)
    goes to the first; padding right after the winner."""
    cases = 0
    for hsize in HSIZES:
        for rows in (r for r in ROW_COUNTS if r * hsize <= MAX_ELEMS):
            hidden = 0.5 + torch.rand(3, hsize, generator=gen)  # positive: one row wins all batch rows
            weight = torch.rand(rows, hsize, generator=gen) * 0.5
            big = torch.full((hsize,), 2.0)
            cand = {0, rows - 1, rows // 2, 63, 64, 65, 127, 128, 4095, 4096, 65536, rows - 64, rows - 65}
            for p in sorted(c for c in cand if 0 <= c < rows):
                saved = weight[p].clone()
                weight[p] = big
                assert _ids(hidden, weight, vocab_start=7).tolist() == [p + 7] * 3, f"H={hsize} rows={rows} at {p}"
                later = [q for q in (p + 1, p + 64, rows - 1) if p < q < rows]
                if later:
                    saved_q = weight[later[-1]].clone()
                    weight[later[-1]] = big
                    assert _ids(hidden, weight).tolist() == [p] * 3, f"tie {p} vs {later[-1]}, H={hsize} rows={rows}"
                    weight[later[-1]] = saved_q
                assert _ids(hidden, weight, num_valid=p + 1).tolist() == [p] * 3
                weight[p] = saved
                cases += 1
    print(f"{cases} planted positions")


@pytest.mark.parametrize("batch", [1, 2, 3, 63, 64, 65, 255, 4095, 4096])
def test_cross_block_batch_sizes(gen, batch):
    """Large batches (row blocks of the batch) on exact integer data."""
    hidden, weight, bias = integer_problem(gen, batch, 130, 9, bias=True)
    ids, _ = localargmax.merge_keys(shard_keys(hidden, make_shards(weight, bias, 2, 64, hidden=hidden)))
    assert torch.equal(ids, ref_argmax(hidden, weight, bias))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_isa_and_threads_bit_identical(gen, dtype):
    """Both CPU ISA variants, 1 and 2 threads: bit-identical keys for every
    hidden width and shard height (chunks are fixed by the problem, not by
    the thread count), an exact tie across blocks included."""
    compared = 0
    for hsize in HSIZES:
        for rows in (r for r in ROW_COUNTS if r * hsize <= MAX_ELEMS // 3):
            hidden = torch.randn(5, hsize, generator=gen).to(dtype)
            weight = torch.randn(rows, hsize, generator=gen).to(dtype)
            bias = torch.randn(rows, generator=gen)
            if rows > 3:
                weight[rows // 3] = weight[rows - 1]
            results = {
                variant: localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=max(1, rows - 1))
                for variant in each_cpu_path_and_thread_count()
            }
            ref = results[("cpu", 1)]
            for key, keys in results.items():
                assert torch.equal(keys, ref), f"{key} differs: H={hsize} rows={rows} {dtype}"
            compared += 1
    print(f"{compared} shapes, 4 variants each")


# ----------------------------------------------------------------------------- indices past 2**24


ROWS = 37
BIG_STARTS = (2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3, 2**25 + 1, 2**31 + 3, 2**32 - 2 - 3 * ROWS, 2**32 - 2 - ROWS + 1)


@pytest.mark.parametrize("start", BIG_STARTS)
def test_large_indices_exact(gen, start):
    """Fault family, indices carried as floats: shards at global offsets where
    a float32 index would round (above 2**24, up to the last legal index
    2**32 - 2): exact ids through shard_argmax, decode_keys, lm_head_argmax
    and lm_head_topk."""
    hidden = torch.randn(6, 40, generator=gen)
    tp = 1 if start + 3 * ROWS - 1 > localargmax.MAX_GLOBAL_INDEX else 3
    weight = torch.randn(tp * ROWS, 40, generator=gen) * 0.01
    winners = torch.tensor([1, 3, 5, ROWS - 2, tp * ROWS - 1, tp * ROWS // 2 | 1])  # odd: float32 rounds them
    weight[winners] = 8 * hidden / (hidden * hidden).sum(dim=1, keepdim=True)
    want = start + winners
    shards = [
        (weight[r * ROWS : (r + 1) * ROWS], None, localargmax.VocabShard(start + r * ROWS, ROWS, ROWS))
        for r in range(tp)
    ]
    assert localargmax.merge_keys(shard_keys(hidden, shards))[0].tolist() == want.tolist()
    assert torch.equal(simulated_argmax(hidden, shards), want)
    assert torch.equal(simulated_argmax(hidden, shards, reduce="all_reduce"), want)
    top, _ = simulated_topk(hidden, shards, 2)
    assert top[:, 0].tolist() == want.tolist() and bool((top >= start).all() & (top < start + tp * ROWS).all())
    idx = [start, start + 1, start + tp * ROWS - 1, localargmax.MAX_GLOBAL_INDEX]
    vals = [1.0, -2.5, float("inf"), 0.0]
    dec_ids, dec_vals = localargmax.decode_keys(torch.tensor([to_int64(pack_key(v, i)) for v, i in zip(vals, idx)]))
    assert dec_ids.tolist() == idx and dec_vals.tolist() == vals
    assert start < 2**24 or any(float(torch.tensor(int(i), dtype=torch.float32)) != int(i) for i in want)


# ----------------------------------------------------------------------------- near-ties on random data


@pytest.mark.parametrize("twins", [False, True], ids=["random", "near_twins"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_near_ties_only_within_error_bound(gen, dtype, twins):
    """Fault family, near-ties: random Gaussian data, no planted winners (tp = 3
    simulated ranks): wherever our id differs from the float64 argmax, the two
    entries' float64 logits lie within the float32 error bound of each other.
    ``near_twins``: every weight row has a twin perturbed by ~1e-7 relative, so
    nearly every row is a near-tie and disagreements really occur."""
    batch, vocab, hsize = 1000, 2000, 96
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    weight = torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)
    if twins:
        half = vocab // 2
        perm = torch.randperm(vocab, generator=gen)
        a, b = perm[:half], perm[half : 2 * half]
        weight[b] = weight[a] * (1 + 1e-7 * torch.randn(half, hsize, generator=gen))
        if dtype == torch.bfloat16:  # keep the twins apart after rounding: one coordinate 1 ulp off
            weight = weight.to(dtype)
            wb = weight[a].clone()
            wb.view(torch.int16)[torch.arange(half), torch.randint(0, hsize, (half,), generator=gen)] += 1
            weight[b] = wb
    weight = weight.to(dtype)
    ids = simulated_argmax(hidden, make_shards(weight, None, 3, 64, hidden=hidden))
    logits, err = ref_logits(hidden, weight), error_bound(hidden, weight)
    rows, ref = torch.arange(batch), logits.argmax(dim=1)
    differ = ids != ref
    gap, slack = logits[rows, ref] - logits[rows, ids], err[rows, ref] + err[rows, ids]
    top2 = logits.topk(2, dim=1).values
    near = (top2[:, 0] - top2[:, 1]) <= err[rows, ref] * 2
    print(f"{dtype} twins={twins}: near-tie rows={int(near.sum())} disagreements={int(differ.sum())}")
    assert bool((ids >= 0).all() & (ids < vocab).all())
    assert bool((gap[differ] <= slack[differ]).all()), (
        f"rows {differ.nonzero().flatten().tolist()[:10]} beyond the bound"
    )
    assert not twins or int(near.sum()) > batch // 10, "the twin construction did not produce near-ties"


# ----------------------------------------------------------------------------- CUDA paths: hard cases


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "batch,hsize",  # H = 4096 at small batches only: the float64 reference is a loop over k
    [(b, h) for h in (8, 40, 264) for b in (1, 8, 9, 17, 33, 64, 65, 130)]
    + [(1, 4096), (9, 4096), (3, 4104), (5, 33), (70, 33)],
)
@pytest.mark.parametrize("bias", [None, "weight"])
def test_cuda_paths_match_reference(gen, dtype, batch, hsize, bias):
    """Every CUDA path against one float64 reference, padding that would win (H = 33: mma declines, simt runs)."""
    hidden, weight, b = random_problem(gen, batch, 1499, hsize, dtype, bias)
    ((w, bb, _),) = make_shards(weight, b, 1, 1501, hidden=hidden)
    reference = reference_logits_and_error(hidden, weight, b)
    for path in each_cuda_path():
        ids = _ids(*on(path, hidden, w), bias=on(path, bb), vocab_start=77, num_valid=1499) - 77
        check_against_reference(
            ids, hidden, weight, b, reference=reference, context=f"{path} {dtype} B={batch} H={hsize}"
        )


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 64, 130])
def test_cuda_exact_ties_at_every_tile_position(gen, dtype, batch):
    """Rule 1 at row g or g + 8 of an m-tile, either m-tile of a warp, any
    warp, any block, any GEMM tile: the smallest index wins."""
    hidden, weight, _ = random_problem(gen, batch, 4100, 64, dtype)
    positions = [4099, 2050, 300, 130, 127, 40, 35, 27, 19, 11, 8, 3]
    weight[positions] = (hidden[0].float() * 3).to(dtype)
    hidden = hidden[:1].expand(batch, -1).contiguous()
    for path in each_cuda_path():
        assert torch.equal(_ids(*on(path, hidden, weight)), torch.full((batch,), 3)), path


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("batch", [5, 130])
@pytest.mark.parametrize("pad", ["huge", "nan"])
def test_cuda_tie_across_shards_of_unequal_num_valid(gen, dtype, tp, batch, pad):
    """The same winning row on the first and the last (partly padding) shard:
    the smaller index wins on every path; the GEMM's shape must not depend on num_valid."""
    hidden, weight, _ = random_problem(gen, batch, 1001, 256, dtype)
    weight[[5, 998]] = (hidden[0].float() * 3).to(dtype)
    hidden = hidden[:1].expand(batch, -1).contiguous()
    shards = make_shards(weight, None, tp, 64, hidden=hidden, pad=pad)
    assert shards[-1][2].num_valid < shards[0][2].num_valid
    for path in each_cuda_path():
        ids, _ = localargmax.merge_keys(shard_keys(on(path, hidden), shards))
        assert torch.equal(ids.cpu(), torch.full((batch,), 5)), path


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_cuda_padding_and_empty_shards(gen, dtype, tp):
    """Vocab not divisible by tp, shards that are all padding, padding that
    would win (huge and NaN), an exact tie across shards."""
    for vocab, batch in ((1, 3), (5, 9), (300, 17), (1001, 70)):
        hidden, weight, _ = random_problem(gen, batch, vocab, 40, dtype)
        weight[vocab // 2] = weight[0]
        # random data: judged with the float32 error bound; the copy of row 0 ties it exactly, so only
        # row 0 may win for the pair (rule 1): its column is taken out of the reference
        logits, err = reference_logits_and_error(hidden, weight)
        if vocab > 1:
            logits[:, vocab // 2] = -math.inf
        for pad in ("huge", "nan"):
            shards = make_shards(weight, None, tp, 64, hidden=hidden, pad=pad)
            for path in each_cuda_path():
                ids, _ = localargmax.merge_keys(shard_keys(on(path, hidden), shards))
                ctx = f"{path} vocab={vocab} pad={pad}"
                check_against_reference(ids, hidden, weight, context=ctx, reference=(logits, err))


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_nan_and_minus_inf_rows(gen, dtype):
    """Rule 2: a NaN logit wins (the smallest NaN index). Rule 3: -inf rows
    lose to any finite logit, and an all -inf batch row picks index 0."""
    hidden, weight, _ = random_problem(gen, 12, 500, 48, dtype)
    hidden = hidden.abs() + 0.01  # positive: a -inf weight row gives a -inf logit, not NaN
    weight[[3, 17, 200]] = float("-inf")
    nan_case = weight.clone()
    nan_case[[250, 90]] = float("nan")
    cases = {"-inf rows": weight, "nan rows": nan_case, "all -inf": torch.full_like(weight, float("-inf"))}
    wants = {name: ref_argmax(hidden, w) for name, w in cases.items()}
    assert int(wants["nan rows"][0]) == 90 and int(wants["all -inf"][0]) == 0
    finite_rows = reference_logits_and_error(hidden, weight)  # "-inf rows": random finite logits elsewhere
    for path in each_cuda_path():
        for name, w in cases.items():
            ids = _ids(*on(path, hidden, w))
            if name == "-inf rows":  # near-ties judged with the float32 error bound
                check_against_reference(ids, hidden, w, context=f"{path}: {name}", reference=finite_rows)
            else:  # decided by rules 2 and 3
                assert torch.equal(ids, wants[name]), f"{path}: {name}"


@cuda_only
def test_cuda_subnormal_logits_are_not_flushed(gen):
    """No flush-to-zero on the comparison path: bf16 weights k * 2**-133
    (subnormal) against hidden 1 give distinct subnormal logits; a flushing
    path would see a tie and answer index 0."""
    tiny = torch.arange(1, 65, dtype=torch.float32) * 2.0**-133
    perm = torch.randperm(64, generator=gen)
    weight = torch.zeros(64, 16)
    weight[:, 0] = tiny[perm]
    weight = weight.to(torch.bfloat16)
    assert bool((weight[:, 0].float() == tiny[perm]).all())  # exact in bf16
    hidden = torch.ones(3, 16, dtype=torch.bfloat16)
    for path in each_cuda_path():
        assert torch.equal(_ids(*on(path, hidden, weight)), torch.full((3,), int(perm.argmax()))), path


@cuda_only
@pytest.mark.parametrize(
    "path_name,batch", [("simt", 65535 * 8 + 3), ("mma", 65535 * 64 + 3), ("gemm", 65535 * 64 + 3)]
)
def test_cuda_batch_past_grid_y_limit(gen, path_name, batch):
    """More batch blocks (simt), 64-row batch chunks (mma) or batch rows (gemm
    keys kernel) than grid y holds: the grid-stride loops cover them all."""
    base, weight, _ = random_problem(gen, 61, 70, 8, torch.bfloat16)
    rows = torch.arange(batch) % 61
    with use_path(KernelPath("cuda", path_name)):
        ids = _ids(base[rows].cuda(), weight.cuda())
    assert torch.equal(ids, ids[:61][rows])  # the same hidden row, the same key at any batch position
    check_against_reference(ids[:61], base, weight, context=path_name)  # random bf16: the float32 bound


@cuda_only
@pytest.mark.parametrize("path_name", ["simt", "mma", "gemm"])
def test_cuda_columns_past_2_to_the_31(gen, path_name):
    """A shard of 2**31 + 200 rows (the limit is 2**31 - 64; this one is cut
    to num_valid = 2**31 - 100): column indexes past 2**31 - 1 overflow 32-bit
    arithmetic (an int column index in logits_to_keys_kernel would). The winner is
    planted in the last block; needs ~36 GiB of device memory (H200 has 139)."""
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip(f"needs 40 GiB of free device memory, {free / 2**30:.0f} GiB free")
    rows, num_valid = 2**31 + 200, 2**31 - 100
    hidden = torch.ones(2, 8, dtype=torch.bfloat16, device="cuda")
    weight = torch.zeros(rows, 8, dtype=torch.bfloat16, device="cuda")
    winner = num_valid - 1 - int(torch.randint(0, 50, (1,), generator=gen))
    weight[winner] = 1.0
    weight[num_valid + 5] = 2.0  # padding past num_valid that would win
    ids = _ids(hidden, weight, vocab_start=2**31 + 50, num_valid=num_valid, path=path_name)  # last id 2**32 - 51
    assert ids.tolist() == [2**31 + 50 + winner] * 2, (ids.tolist(), winner)
    del weight
    torch.cuda.empty_cache()


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 130])
def test_cuda_misaligned_hidden_gives_the_keys_of_an_aligned_one(gen, dtype, batch):
    """The path and the vector width (so the summation order) must depend only
    on the weight's layout and the shared arguments, never on where hidden
    happens to sit: a hidden at a 2-byte offset, or with an odd row stride,
    gives bit-identical keys to a contiguous aligned copy on every path (a rank
    whose activations sit misaligned would otherwise sum in another order)."""
    hidden, weight, _ = random_problem(gen, batch, 3000, 264, dtype)
    h, w = hidden.cuda(), weight.cuda()
    offset = torch.empty(batch * 264 + 1, dtype=dtype, device="cuda")[1:].view(batch, 264)
    offset.copy_(h)
    strided = torch.empty(batch, 271, dtype=dtype, device="cuda")[:, :264]
    strided.copy_(h)
    assert offset.data_ptr() % 16 != 0 and strided.stride(0) % 8 != 0
    for path in ("auto", "simt", "mma", "gemm"):
        want = localargmax.shard_argmax(h, w, path=path)
        for name, other in (("offset", offset), ("strided", strided)):
            assert torch.equal(localargmax.shard_argmax(other, w, path=path), want), f"{path} {name}"


@cuda_only
def test_cuda_path_arg_is_checked(gen):
    """An unknown path, or a forced path that cannot take the inputs, raises
    ValueError naming it (no silent fallback)."""
    hidden, weight, _ = random_problem(gen, 2, 64, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="path must be one of"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda(), path="tensorcore")
    with pytest.raises(ValueError, match="path='mma' needs"):
        localargmax.shard_argmax(hidden[:, :30].cuda(), weight[:, :30].cuda(), path="mma")
    with pytest.raises(ValueError, match="does not exist for top-k"):
        localargmax.shard_topk(hidden.cuda(), weight.cuda(), 2, path="gemm")
    with pytest.raises(ValueError, match="needs bfloat16 or float16"):
        localargmax.shard_argmax(hidden.float().cuda(), weight.float().cuda(), path="gemm")


MMA_VARIANT_IDS = list(range(localargmax._validation.NUM_MMA_VARIANTS))
TMA_TWINS = {16: 4, 17: 5, 18: 13, 19: 14, 20: 15}
"""The TMA variants (weight tiles by bulk tensor copy, sm_90+) and their cp.async twins."""
SAME_ORDER_MMA_PAIRS = [(4, 7, 8), (5, 8, 16), (6, 9, 32), (10, 12, 64), (6, 13, 32), (10, 14, 64), (10, 15, 64)] + [
    (twin, tma, {4: 8, 5: 16, 13: 32, 14: 64, 15: 64}[twin]) for tma, twin in TMA_TWINS.items()
]
"""DESIGN.md rule 5: (variant, variant, a batch of their class) that sum in the same order."""


def _tma_unsupported(variant: int) -> bool:
    """A TMA variant on a device below compute capability 9.0 (run_mma refuses it)."""
    return variant in TMA_TWINS and torch.cuda.get_device_capability()[0] < 9


def test_mma_variant_path_is_checked_before_the_kernel():
    """``"mma/<id>"`` names a tensor-core variant on CUDA only: ids 0 to
    NUM_MMA_VARIANTS - 1 (decimal, no sign or leading zero); anything else, and
    any ``"mma/..."`` on the CPU, is a ValueError naming the path (no GPU needed)."""
    from localargmax._validation import check_path_arg, mma_variant_of

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for v in MMA_VARIANT_IDS:
        check_path_arg(f"mma/{v}", cuda)
        assert mma_variant_of(f"mma/{v}") == v
    past = f"mma/{len(MMA_VARIANT_IDS)}"
    for bad in (past, "mma/-1", "mma/07", "mma/", "mma/x", "mma/ 1", "mma/1 ", "mma/٣", "MMA/4", "mma4", 4):
        assert mma_variant_of(bad) is None
        with pytest.raises(ValueError, match=f"path must be one of .* on cuda, got {bad!r}"):
            check_path_arg(bad, cuda)
    with pytest.raises(ValueError, match=rf"mma/<0\.\.{len(MMA_VARIANT_IDS) - 1}>"):
        check_path_arg("mma/99", cuda)
    with pytest.raises(ValueError, match="path must be one of .* on cpu, got 'mma/4'"):
        check_path_arg("mma/4", cpu)
    hidden, weight = torch.randn(2, 16).to(torch.bfloat16), torch.randn(64, 16).to(torch.bfloat16)
    for call in (
        lambda: localargmax.shard_argmax(hidden, weight, path="mma/4"),
        lambda: localargmax.shard_sample(hidden, weight, torch.ones(2), 1, path="mma/7"),
        lambda: localargmax.shard_topk(hidden, weight, 2, path="mma/10"),
    ):
        with pytest.raises(ValueError, match="path must be one of .* on cpu, got 'mma/"):
            call()
    with pytest.raises(ValueError, match="path must be 'auto', 'generic' or 'avx2' on CPU, got 'mma/4'"):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 64, "mma/4")


def test_num_mma_variants_matches_the_cuda_table():
    """The validator's id range is the MmaVariant table's (kNumMmaVariants)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "csrc/cuda/shard_argmax_launch.cuh").read_text()
    assert f"constexpr int kNumMmaVariants = {localargmax._validation.NUM_MMA_VARIANTS};" in text


@cuda_only
def test_cuda_mma_variant_path_refusals(gen):
    """The C++ op refuses an unknown variant id and a variant that cannot take
    the inputs (H not a multiple of 8, float32, top-k), naming the path."""
    hidden, weight, _ = random_problem(gen, 2, 64, 32, torch.bfloat16)
    h, w = hidden.cuda(), weight.cuda()
    past = f"mma/{len(MMA_VARIANT_IDS)}"
    with pytest.raises(ValueError, match=f"path='{past}' names no tensor-core variant"):
        torch.ops.localargmax.shard_argmax.default(h, w, None, 0, 64, past)
    if torch.cuda.get_device_capability()[0] < 9:  # the TMA variants: sm_90+
        for v in TMA_TWINS:
            with pytest.raises(ValueError, match=f"path='mma/{v}' copies the weight by TMA .* compute capability 9"):
                torch.ops.localargmax.shard_argmax.default(h, w, None, 0, 64, f"mma/{v}")
    with pytest.raises(ValueError, match="path must be 'auto', 'simt', 'mma', 'mma/<id>' or 'gemm'"):
        torch.ops.localargmax.shard_argmax.default(h, w, None, 0, 64, "mma/x")
    with pytest.raises(ValueError, match="path='mma/7' needs sm_80\\+"):
        localargmax.shard_argmax(hidden[:, :30].cuda(), weight[:, :30].cuda(), path="mma/7")
    with pytest.raises(ValueError, match="path='mma/4' needs bfloat16 or float16"):
        localargmax.shard_argmax(h.float(), w.float(), path="mma/4")
    with pytest.raises(ValueError, match="path='mma/10' does not exist for top-k"):
        localargmax.shard_topk(h, w, 2, path="mma/10")


@cuda_only
@pytest.mark.parametrize("variant", MMA_VARIANT_IDS)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "f16"])
def test_every_cuda_mma_variant_against_the_reference(gen, variant, dtype):
    """path='mma/<id>' runs that variant: planted winners (a wide gap) give the
    float64 reference's ids at batches below, at and past the variant's batch
    rows (extra passes), with padding rows and a k tail; argmax and sample
    (temperature 0 is greedy). A TMA variant below sm_90 is refused instead
    (test_cuda_mma_variant_path_refusals)."""
    if _tma_unsupported(variant):
        with pytest.raises(ValueError, match="compute capability 9"):
            hidden, weight, _ = random_problem(gen, 2, 64, 32, dtype)
            localargmax.shard_argmax(hidden.cuda(), weight.cuda(), path=f"mma/{variant}")
        return
    for batch, hsize in ((1, 4104), (9, 136), (33, 520), (70, 4096), (129, 264)):
        hidden, weight, _ = random_problem(gen, batch, 9000, hsize, dtype)
        winners = torch.randperm(8900, generator=gen)[:batch]  # distinct: every row keeps its plant
        weight[winners] = (hidden.float() * 3).to(dtype)  # ~3H against other plants ~N(0, 9H), others ~N(0, 1)
        bias = torch.randn(9000, generator=gen) * 0.01
        want = reference_argmax(hidden, weight[:8900], bias[:8900])
        h, w, b = hidden.cuda(), weight.cuda(), bias.cuda()
        got = _ids(h, w, bias=b, vocab_start=5, num_valid=8900, path=f"mma/{variant}") - 5
        assert torch.equal(got, want), f"mma/{variant} batch {batch} H {hsize}"
        sampled = localargmax.shard_sample(
            h, w, torch.zeros(batch, device="cuda"), 3, bias=b, vocab_start=5, num_valid=8900, path=f"mma/{variant}"
        )
        assert torch.equal(localargmax.decode_keys(sampled)[0].cpu() - 5, want), f"sample mma/{variant} batch {batch}"


@cuda_only
@pytest.mark.parametrize("pair", SAME_ORDER_MMA_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "f16"])
def test_cuda_same_order_mma_variants_give_identical_keys(gen, pair, dtype):
    """DESIGN.md rule 5: variants of one order class (4/7, 5/8, 6/9, 10/12, 6/13, 10/14, 10/15, and
    each TMA variant with its cp.async twin: 4/16, 5/17, 13/18, 14/19, 15/20) give bit-identical
    keys on random floats, with a bias and padding (the TMA ones on sm_90+)."""
    a, b, batch = pair
    if _tma_unsupported(b):
        pytest.skip(f"mma/{b} copies by TMA: sm_90+ (its refusal below: test_cuda_mma_variant_path_refusals)")
    for hsize in (4096, 1032):
        hidden, weight, _ = random_problem(gen, batch, 20000, hsize, dtype)
        bias = (torch.randn(20000, generator=gen) * 0.1).cuda()
        h, w = hidden.cuda(), weight.cuda()
        keys = [
            localargmax.shard_argmax(h, w, bias=bias, vocab_start=7, num_valid=19990, path=f"mma/{v}") for v in (a, b)
        ]
        assert torch.equal(keys[0], keys[1]), f"mma/{a} vs mma/{b}, H {hsize}"


@cuda_only
@pytest.mark.parametrize("batch", [4, 200])
def test_cuda_graph_capture_each_path(gen, batch):
    for path in each_cuda_path():
        hidden, weight, _ = random_problem(gen, batch, 5000, 128, torch.bfloat16)
        h, w = hidden.cuda(), weight.cuda()
        localargmax.shard_argmax(h, w)  # warm up (cuBLAS handles, workspaces) outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            keys = localargmax.shard_argmax(h, w)
        new_hidden, new_weight, _ = random_problem(gen, batch, 5000, 128, torch.bfloat16)
        h.copy_(new_hidden.cuda())
        w.copy_(new_weight.cuda())
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(localargmax.decode_keys(keys)[0].cpu(), new_hidden, new_weight, context=str(path))


@needs_gxx
def test_mma_fragment_cpp(tmp_path, seed):
    """tests/cpp/test_mma_fragment.cpp: the tensor-core kernel's register map
    (csrc/common/mma_fragment.h) against an emulation of mma.sync m16n8k16
    written from the PTX ISA fragment tables, on the CPU."""
    check_cpp_test("test_mma_fragment", tmp_path, seed)


MMA_FRAGMENT_MUTATIONS = {  # id: (text of csrc/common/mma_fragment.h, broken replacement)
    "a_row_half": ("{ return reg % 2; }", "{ return reg / 2; }"),
    "a_word": ("return 2 * s + reg / 2;", "return 2 * s + reg % 2;"),
    "b_word": ("return 2 * s + reg; }", "return 2 * (1 - s) + reg; }"),
    "c_col": ("return 2 * (lane % 4) + r % 2;", "return 2 * (lane % 4) + r / 2;"),
    "chunk_k": ("return 8 * t + 4 * s + 2 * h + j;", "return 8 * t + 4 * s + h + 2 * j;"),
}


@needs_gxx
@pytest.mark.parametrize("mutation", list(MMA_FRAGMENT_MUTATIONS))
def test_cpp_test_catches_broken_fragments(tmp_path, mutation):
    """The C++ test can fail: it does against a broken copy of mma_fragment.h."""
    run_against_mutation("test_mma_fragment", "mma_fragment.h", *MMA_FRAGMENT_MUTATIONS[mutation], tmp_path)


# ----------------------------------------------------------------------------- bad input (every fused entry point)

H, ROWS_, B = 8, 6, 3
BIG, PAST_BIG, I32 = localargmax.MAX_GLOBAL_INDEX, r"vocab_start \+ num_valid - 1", torch.int32


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) * 31)).to(dtype)


# the shard arguments every fused op checks: id -> (hidden, weight, {layout kwargs}, exception, message)
BAD_SHARD = {
    "hidden_1d": (_t(H), _t(ROWS_, H), {}, ValueError, "hidden must be 2-D"),
    "hidden_3d": (_t(2, B, H), _t(ROWS_, H), {}, ValueError, "hidden must be 2-D"),
    "weight_1d": (_t(B, H), _t(H), {}, ValueError, "weight must be 2-D"),
    "weight_3d": (_t(B, H), _t(2, ROWS_, H), {}, ValueError, "weight must be 2-D"),
    "bias_2d": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_, 1)}, ValueError, "bias must be 1-D"),
    "bias_wrong_length": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_ - 1)}, ValueError, r"bias must be 1-D \[rows=6\]"),
    "bias_f16_for_f32": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_, dtype=torch.float16)}, TypeError, "bias dtype"),
    "bias_int": (_t(B, H), _t(ROWS_, H), {"bias": torch.zeros(ROWS_, dtype=torch.int32)}, TypeError, "bias dtype"),
    "bias_f64": (_t(B, H), _t(ROWS_, H), {"bias": torch.zeros(ROWS_, dtype=torch.float64)}, TypeError, "bias dtype"),
    "dtype_mismatch": (_t(B, H), _t(ROWS_, H, dtype=torch.bfloat16), {}, TypeError, "hidden dtype"),
    "dtype_mismatch_f16": (_t(B, H, dtype=torch.float16), _t(ROWS_, H), {}, TypeError, "hidden dtype"),
    "int_weight": (torch.ones(B, H, dtype=I32), torch.ones(ROWS_, H, dtype=I32), {}, TypeError, "weight dtype"),
    "f64_weight": (_t(B, H, dtype=torch.float64), _t(ROWS_, H, dtype=torch.float64), {}, TypeError, "weight dtype"),
    "int_weight_f32_hidden": (_t(B, H), torch.ones(ROWS_, H, dtype=torch.int64), {}, TypeError, "weight dtype"),
    "hidden_size_mismatch": (_t(B, H + 1), _t(ROWS_, H), {}, ValueError, "hidden_size"),
    "weight_transposed": (_t(B, H), _t(H, H).t(), {}, ValueError, "contiguous"),
    "weight_column_strided": (_t(B, H), _t(ROWS_, 2 * H)[:, ::2], {}, ValueError, "contiguous"),
    "num_valid_gt_rows": (_t(B, H), _t(ROWS_, H), {"num_valid": ROWS_ + 1}, ValueError, "num_valid"),
    "num_valid_negative": (_t(B, H), _t(ROWS_, H), {"num_valid": -1}, ValueError, "num_valid"),
    "vocab_start_negative": (_t(B, H), _t(ROWS_, H), {"vocab_start": -1}, ValueError, "vocab_start"),
    "index_past_2pow32m2": (_t(B, H), _t(ROWS_, H), {"vocab_start": BIG - ROWS_ + 2}, ValueError, PAST_BIG),
    "index_far_past": (_t(B, H), _t(ROWS_, H), {"vocab_start": 2**40, "num_valid": 1}, ValueError, PAST_BIG),
}
BAD_SHARD_WRAPPER_ONLY = {  # Python-level types the raw op cannot even receive
    "num_valid_float": (_t(B, H), _t(ROWS_, H), {"num_valid": 2.0}, TypeError, "num_valid"),
    "num_valid_bool": (_t(B, H), _t(ROWS_, H), {"num_valid": True}, TypeError, "num_valid"),
    "vocab_start_float": (_t(B, H), _t(ROWS_, H), {"vocab_start": 1.5}, TypeError, "vocab_start"),
    "vocab_start_str": (_t(B, H), _t(ROWS_, H), {"vocab_start": "0"}, TypeError, "vocab_start"),
    "hidden_list": ([[1.0] * H], _t(ROWS_, H), {}, TypeError, "hidden"),
    "weight_list": (_t(B, H), [[1.0] * H], {}, TypeError, "weight"),
    "bias_list": (_t(B, H), _t(ROWS_, H), {"bias": [0.0] * ROWS_}, TypeError, "bias"),
}
ENTRY_POINTS = {  # name -> (fn, extra positional args, extra keyword args)
    "shard_argmax": (localargmax.shard_argmax, (), {}),
    "lm_head_argmax": (localargmax.lm_head_argmax, (), {}),
    "shard_topk": (localargmax.shard_topk, (1,), {}),
    "lm_head_topk": (localargmax.lm_head_topk, (1,), {}),
    "shard_sample": (localargmax.shard_sample, (torch.ones(B), 7), {}),
    "lm_head_sample": (localargmax.lm_head_sample, (), {"temperature": 1.0, "seed": 7}),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("case", list(BAD_SHARD) + list(BAD_SHARD_WRAPPER_ONLY))
def test_fused_ops_reject_malformed_shards(entry, case):
    """Every fused entry point refuses a malformed shard with an error naming
    the argument, and leaves its inputs unmodified."""
    hidden, weight, kwargs, exc, match = {**BAD_SHARD, **BAD_SHARD_WRAPPER_ONLY}[case]
    fn, extra, extra_kw = ENTRY_POINTS[entry]
    if entry == "shard_sample" and case == "hidden_1d":
        match = "hidden must be 2-D|temperature"
    raises_cleanly(exc, match, fn, hidden, weight, *extra, **{**extra_kw, **kwargs})


@pytest.mark.parametrize("case", list(BAD_SHARD))
def test_shard_argmax_op_rejects(case):
    """The raw op (no Python wrapper): the C++ checks raise, never crash."""
    hidden, weight, kwargs, exc, match = BAD_SHARD[case]
    layout = {"vocab_start": 0, "num_valid": weight.shape[0] if weight.dim() == 2 else 0, **kwargs}
    with pytest.raises(exc, match=match):
        torch.ops.localargmax.shard_argmax.default(
            hidden, weight, layout.get("bias"), layout["vocab_start"], layout["num_valid"]
        )


def test_largest_legal_index_is_accepted():
    keys = localargmax.shard_argmax(_t(2, H), _t(ROWS_, H), vocab_start=BIG - ROWS_ + 1, num_valid=ROWS_)
    assert bool((localargmax.decode_keys(keys)[0] <= BIG).all())
    # num_valid == 0: vocab_start is never used as an index
    assert localargmax.shard_argmax(_t(2, H), _t(ROWS_, H), vocab_start=2**40, num_valid=0).eq(0).all()


def test_single_row_column_strided_weight(gen):
    """A [1, H] weight view with stride(1) == 2 is not row-contiguous: it must
    be refused like any other column-strided weight, or read correctly."""
    hidden = torch.randn(3, H, generator=gen)
    weight = torch.randn(1, 2 * H, generator=gen)[:, ::2]
    assert weight.shape == (1, H) and weight.stride(1) == 2
    bias = torch.randn(1, generator=gen)
    want = (hidden.double() @ weight.double().T).flatten() + bias.double()
    for call in (
        lambda: localargmax.shard_argmax(hidden, weight, bias=bias),
        lambda: torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, 0, 1),
    ):
        try:
            values = localargmax.decode_keys(call())[1]
        except ValueError as e:
            assert "contiguous" in str(e)
            continue
        assert torch.allclose(values.double(), want, rtol=1e-5, atol=1e-5), f"read wrongly: {values.tolist()}"


def test_accepted_layouts_give_the_same_answer(gen):
    """Non-contiguous hidden / bias and a row-strided weight (rows contiguous,
    stride(0) > H) are fine and give the same keys."""
    hidden, weight, bias = (
        torch.randn(7, H, generator=gen),
        torch.randn(40, H, generator=gen),
        torch.randn(40, generator=gen),
    )
    want = localargmax.shard_argmax(hidden, weight, bias=bias)
    hidden_t = hidden.t().contiguous().t()
    weight_rs = torch.cat([weight, torch.randn(40, 3, generator=gen)], dim=1)[:, :H]
    bias_s = torch.stack([bias, bias], dim=1)[:, 0]
    assert not hidden_t.is_contiguous() and weight_rs.stride() == (H + 3, 1) and not bias_s.is_contiguous()
    assert torch.equal(localargmax.shard_argmax(hidden_t, weight_rs, bias=bias_s), want)
    assert torch.equal(torch.ops.localargmax.shard_argmax.default(hidden_t, weight_rs, bias_s, 0, 40), want)


# ----------------------------------------------------------------------------- the path keyword on CPU


@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_cpu_path_keyword(gen, op):
    """CPU paths: generic and avx2 (where the CPU has it) give bit-identical
    keys; an unknown path, or a CUDA path on CPU, is a ValueError naming
    ``path`` (checked by the wrapper and by the kernel itself)."""
    hidden = torch.randn(5, 37, generator=gen).to(torch.bfloat16)
    weight = torch.randn(200, 37, generator=gen).to(torch.bfloat16)
    call = {
        "argmax": lambda p: localargmax.shard_argmax(hidden, weight, path=p),
        "topk": lambda p: localargmax.shard_topk(hidden, weight, 3, path=p),
        "sample": lambda p: localargmax.shard_sample(hidden, weight, torch.full((5,), 0.7), 9, path=p),
    }[op]
    auto, generic = call("auto"), call("generic")
    assert torch.equal(auto, generic)
    try:
        avx2 = call("avx2")
    except ValueError as e:  # a CPU without AVX2: the refusal must say why
        assert "needs a CPU with AVX2" in str(e)
    else:
        assert torch.equal(avx2, generic)
    for bad in ("mma", "simt", "mma/4", "AVX2", "", None, 3):
        with pytest.raises(ValueError, match="path must be one of"):
            call(bad)
    with pytest.raises(ValueError, match="path must be 'auto', 'generic' or 'avx2' on CPU"):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 200, "gemm")


# ----------------------------------------------------------------------------- the log-partition pair


def _dominant_padding(hidden, weight, num_valid):
    """Padding rows whose logits (~1024 |h|^2) would decide the sum if counted."""
    h = hidden.float()
    weight[num_valid:] = (1024 * h[torch.arange(weight.shape[0] - num_valid) % h.shape[0]]).to(weight.dtype)


def log_partition_error(pairs, hidden, weight, bias, num_valid, scale=1.0, soft_cap=None) -> float:
    """Largest |ref + log(sum) - float64 logsumexp of the valid rows' transformed logits|."""
    b = None if bias is None else bias[:num_valid]
    x = ref_transform(ref_logits(hidden, weight[:num_valid], b), scale, soft_cap)
    got = pairs[:, 0].double() + pairs[:, 1].double().log()
    return float((got - torch.logsumexp(x, dim=1)).abs().max())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_log_partition_pair_on_every_cpu_path_and_thread_count(gen, dtype):
    """shard_argmax(log_partition=True): without a transform the same keys as
    shard_argmax; ref is the value of the row's key; ref + log(sum) is the
    float64 logsumexp of the valid rows only (padding that would dominate
    excluded), within 1e-5; the pairs are bit-identical on both ISA variants
    and 1 or 2 threads (tiles merged in order, whatever the chunking)."""
    for hsize, rows in ((7, 200), (64, 1000), (40, 4097)):
        hidden, weight, bias = random_problem(gen, 5, rows, hsize, dtype, bias="float32")
        hidden = (hidden.float() * 3).to(dtype)
        num_valid = rows - 10
        _dominant_padding(hidden, weight, num_valid)
        for scale, cap in ((1.0, None), (0.3, 5.0)):
            kw = dict(bias=bias, num_valid=num_valid, log_partition=True, scale=scale, soft_cap=cap)
            results = {
                variant: localargmax.shard_argmax(hidden, weight, **kw) for variant in each_cpu_path_and_thread_count()
            }
            keys, pairs = results[("cpu", 1)]
            for variant, (k, p) in results.items():
                assert torch.equal(k, keys) and torch.equal(p.view(torch.int32), pairs.view(torch.int32)), variant
            if cap is None:
                assert torch.equal(keys, localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid))
            assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1])
            err = log_partition_error(pairs, hidden, weight, bias, num_valid, scale, cap)
            assert err <= 1e-5, (hsize, rows, scale, err)


def test_log_partition_opcheck_empty_shard_and_batch_zero(gen):
    """opcheck of shard_argmax_lse; an empty shard gives (-inf, 0) (and keys
    0), a batch of 0 rows a [0, 2] pair tensor."""
    hidden, weight, bias = random_problem(gen, 4, 150, 16, bias="float32")
    op = torch.ops.localargmax.shard_argmax_lse.default
    for path in ("auto", "generic"):
        torch.library.opcheck(op, (hidden, weight, None, 10, 140), {"path": path})
        torch.library.opcheck(op, (hidden, weight, bias, 0, 150, 0.5, 3.0), {"path": path})
        torch.library.opcheck(op, (hidden[:0], weight, bias, 0, 150), {"path": path})
    keys, pairs = localargmax.shard_argmax(hidden, weight, num_valid=0, log_partition=True)
    assert torch.equal(keys, torch.zeros(4, dtype=torch.int64))
    assert pairs.tolist() == [[-math.inf, 0.0]] * 4
    keys, pairs = localargmax.shard_argmax(hidden[:0], weight, log_partition=True)
    assert keys.shape == (0,) and pairs.shape == (0, 2) and pairs.dtype == torch.float32


def test_log_partition_arguments_name_them(gen):
    hidden, weight, _ = random_problem(gen, 2, 10, 4)
    bad = [
        (dict(log_partition=1), TypeError, "log_partition must be a bool"),
        (dict(log_partition=True, scale=0.0), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=-1.0), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=math.inf), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=True), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, soft_cap=0.0), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(log_partition=True, soft_cap=math.nan), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(scale=2.0), ValueError, "pass log_partition=True"),
        (dict(soft_cap=30.0), ValueError, "pass log_partition=True"),
    ]
    for kw, exc, match in bad:
        for call in (
            lambda: localargmax.shard_argmax(hidden, weight, **kw),
            lambda: localargmax.shard_topk(hidden, weight, 2, **kw),
            lambda: localargmax.shard_sample(hidden, weight, torch.ones(2), 0, **kw),
        ):
            with pytest.raises(exc, match=match):
                call()
    # the C++ op checks the same (direct torch.ops calls)
    for scale, cap in ((0.0, 0.0), (1.0, -1.0), (math.nan, 0.0), (1e-50, 0.0)):
        with pytest.raises(ValueError, match="log-partition: scale|log-partition: soft_cap"):
            torch.ops.localargmax.shard_argmax_lse.default(hidden, weight, None, 0, 10, scale, cap)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("batch", [1, 9, 130])
def test_cuda_log_partition_on_every_path(gen, dtype, batch):
    """CUDA: shard_argmax / shard_topk / shard_sample with log_partition on
    simt, gemm (bf16 / fp16) and auto: the pair's ref + log(sum) within 1e-5
    of the float64 logsumexp of the valid rows (padding that would dominate
    excluded), ids as the CPU's on a planted problem; path='mma' raises."""
    hidden, weight, bias, winners = planted_problem(gen, batch, 3000, 64, dtype, bias="float32")
    num_valid = 2990
    keep = winners < num_valid  # rows whose planted winner stays in the vocabulary: their ids are checked
    _dominant_padding(hidden, weight, num_valid)
    want_ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid))[0]
    paths = ["auto", "simt"] + (["gemm"] if dtype != torch.float32 else [])
    for path in paths:
        for scale, cap in ((1.0, None), (0.5, 4.0)):
            kw = dict(bias=bias.cuda(), num_valid=num_valid, log_partition=True, scale=scale, soft_cap=cap, path=path)
            keys, pairs = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), **kw)
            err = log_partition_error(pairs.cpu(), hidden, weight, bias, num_valid, scale, cap)
            assert err <= 1e-5, (path, scale, cap, err)
            assert torch.equal(pairs[:, 0].cpu(), localargmax.decode_keys(keys.cpu())[1])
            if cap is None:
                assert torch.equal(localargmax.decode_keys(keys.cpu())[0][keep], want_ids[keep])
            t = torch.full((batch,), 0.8, device="cuda")
            s_keys, s_pairs = localargmax.shard_sample(hidden.cuda(), weight.cuda(), t, 3, 0, **kw)
            assert bool(torch.isfinite(s_pairs).all())
        if path != "gemm":
            top, top_pairs = localargmax.shard_topk(hidden.cuda(), weight.cuda(), 4, **dict(kw, path=path))
            assert torch.equal(top[:, 0], keys)
    with pytest.raises(ValueError, match="path='mma' cannot compute the log-partition"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda(), log_partition=True, path="mma")
