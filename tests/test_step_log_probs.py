"""lm_head_argmax / topk / sample with return_log_probs=True: the fused
log-probabilities against float64 across simulated ranks (every transform,
fp32 and bf16), planted specials (NaN, +-inf, all -inf rows), huge and tiny
logits, batch 0 and world size 1, bad arguments, ranks that disagree on the
flag, torch.compile."""

from __future__ import annotations

import math
import re

import pytest
import torch

import localargmax
from tests.support.problems import (
    make_shards,
    random_problem,
    simulated_argmax_log_probs,
    simulated_sample_log_probs,
    simulated_topk_log_probs,
    stack_frames,
)
from tests.support.reference import (
    judge,
    log_prob_tolerance,
    ref_log_probs,
    ref_logits,
    reference_logits_and_error,
)

# ----------------------------------------------------------------------------- log-probabilities

TRANSFORMS = {
    "plain": {},
    "scale": {"logit_scale": 0.37},
    "soft_cap": {"soft_cap": 2.5},
    "both": {"logit_scale": 1.7, "soft_cap": 4.0},
}


def _transform(lp: dict) -> tuple[float, float | None]:
    return lp.get("logit_scale", 1.0), lp.get("soft_cap")


def _check_log_probs(got, ids, table, tol, context):
    """``got`` (log-probs of ``ids``) against the float64 ``table``: NaN and
    -inf exactly where the reference has them, the rest within ``tol``.
    Returns the largest error."""
    want = table.gather(1, ids if ids.dim() == 2 else ids[:, None])
    got = got.double().reshape(want.shape)
    assert torch.equal(got.isnan(), want.isnan()), (context, got, want)
    assert torch.equal(got == -math.inf, want == -math.inf), (context, got, want)
    finite = want.isfinite()
    err = float((got[finite] - want[finite]).abs().max()) if bool(finite.any()) else 0.0
    assert err <= tol, f"{context}: log-prob error {err:.3g} > {tol:.3g}"
    return err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("case", list(TRANSFORMS))
def test_log_probs_match_float64_across_simulated_ranks(gen, dtype, tp, case):
    """lm_head_argmax / topk / sample with return_log_probs on simulated
    ranks (a vocabulary that rarely divides by tp; padding that would dominate
    the sum if counted, a bias; pad_to 256 leaves later ranks empty) against
    float64 log_softmax of the full unsharded transformed logits: within the
    error bound, and within 1e-5 for these float32 problems."""
    lp = TRANSFORMS[case]
    scale, cap = _transform(lp)
    vocab = int(torch.randint(300, 1500, (1,), generator=gen))
    hidden, weight, bias = random_problem(gen, 7, vocab, 48, dtype, bias="float32")
    hidden = (hidden.float() * 3).to(dtype)  # logits ~N(0, 9): a spread-out softmax
    logits = ref_logits(hidden, weight, bias)
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.05, 7.0, 1.0])
    table, table_t = ref_log_probs(logits, scale, cap), ref_log_probs(logits, scale, cap, t)
    tol = log_prob_tolerance(hidden, weight, bias, scale, cap, t, tp=tp)
    worst = 0.0
    for pad_to in (1, 64, 256):
        shards = make_shards(weight, bias, tp, pad_to, hidden=hidden)
        ids, got = simulated_argmax_log_probs(hidden, shards, **lp)
        worst = max(worst, _check_log_probs(got, ids, table, tol, f"argmax pad_to={pad_to}"))
        assert float((table.max(dim=1).values - table.gather(1, ids[:, None])[:, 0]).max()) <= tol  # the argmax
        top_ids, top = simulated_topk_log_probs(hidden, shards, 5, **lp)
        assert torch.equal(top_ids[:, 0], ids)
        worst = max(worst, _check_log_probs(top, top_ids, table, tol, f"topk pad_to={pad_to}"))
        s_ids, s_lp = simulated_sample_log_probs(hidden, shards, t, seed=11, offset=5, **lp)
        _check_log_probs(s_lp, s_ids, table_t, tol, f"sample pad_to={pad_to}")
        # a sampled log-prob carries the float32 logit rounding divided by T: its 1e-5 is per unit of max(1, 1/T)
        w = torch.where(t > 0, t.clamp(max=1.0), torch.ones_like(t)).double()
        worst = max(worst, _check_log_probs(s_lp.double() * w, s_ids, table_t * w[:, None], tol, "sample, x min(1, T)"))
        assert torch.equal(s_ids[0], ids[0])  # T == 0: greedy, the argmax's log-prob
        assert torch.equal(s_lp[0], got[0])
    assert worst <= 1e-5, worst


def test_log_probs_planted_specials(gen):
    """Rows that are all -inf (NaN, as log_softmax), a NaN entry (the whole
    row NaN), a +inf entry (NaN for it, -inf for the rest), -inf entries
    (they add nothing), and padding whose +inf / huge logits would decide
    the sum if counted; tp = 3 with an empty last shard."""
    vocab, hsize = 70, 8
    weight = torch.rand(vocab, hsize, generator=gen) + 0.5  # column 0 > 0
    hidden = torch.randn(5, hsize, generator=gen)
    hidden[0, 0] = -math.inf  # row 0: every logit -inf
    weight[13, 1] = math.inf
    hidden[:, 1] = torch.tensor([-1.0, 0.0, -2.0, 3.0, 0.0])  # rows 1, 4: NaN at 13 (0 * inf); 2: -inf; 3: +inf
    hidden[4, 0] = math.inf  # row 4: +inf everywhere else too
    logits, err = reference_logits_and_error(hidden, weight)
    table = ref_log_probs(logits)
    for tp, pad_to in ((1, 1), (3, 32), (4, 64)):
        shards = make_shards(weight, None, tp, pad_to, hidden=hidden.nan_to_num(0, 0, 0))
        for w, _, s in shards:  # padding: +inf for every row
            w[s.num_valid :] = math.inf
        ids, got = simulated_argmax_log_probs(hidden, shards)
        _check_log_probs(got, ids, table, 1e-5, f"tp={tp}")
        assert ids.tolist()[:2] == [0, 13] and int(ids[3]) == 13
        _, wrong, too_far = judge(ids[2:3], logits[2:3], err[2:3])  # row 2: random finite logits
        assert not bool(wrong.any() or too_far.any()), (ids[2], logits[2].argmax())
        top_ids, top = simulated_topk_log_probs(hidden, shards, 3)
        _check_log_probs(top, top_ids, table, 1e-5, f"topk tp={tp}")
    assert table[0].isnan().all() and table[1].isnan().all() and table[3, 13].isnan()
    assert (table[3, :13] == -math.inf).all() and table[2].isfinite().sum() == vocab - 1


@pytest.mark.parametrize("magnitude", [1e4, 1e-4])
def test_log_probs_huge_and_tiny_logits(gen, magnitude):
    """Logits of magnitude 1e4 (a naive exp overflows) and 1e-4 (a nearly
    uniform softmax over V): float64 agreement within the bound, finite."""
    hidden, weight, _ = random_problem(gen, 4, 500, 32)
    hidden = hidden * magnitude
    logits = ref_logits(hidden, weight)
    tol = log_prob_tolerance(hidden, weight, tp=3)
    for scale, cap in ((1.0, None), (2.0, 50.0)):
        table = ref_log_probs(logits, scale, cap)
        shards = make_shards(weight, None, 3, 64, hidden=hidden)
        lp = {"logit_scale": scale} if cap is None else {"logit_scale": scale, "soft_cap": cap}
        ids, got = simulated_topk_log_probs(hidden, shards, 8, **lp)
        assert bool(got.isfinite().all())
        _check_log_probs(got, ids, table, tol * scale, f"{magnitude} {scale} {cap}")


def test_log_probs_batch_zero_and_world_size_one(gen):
    hidden, weight, _ = random_problem(gen, 0, 100, 16)
    ids, lp = localargmax.lm_head_argmax(hidden, weight, return_log_probs=True)
    assert ids.shape == lp.shape == (0,) and lp.dtype == torch.float32
    ids, lp = localargmax.lm_head_topk(hidden, weight, 3, return_log_probs=True)
    assert ids.shape == lp.shape == (0, 3)
    ids, lp = localargmax.lm_head_sample(hidden, weight, temperature=1.0, seed=1, return_log_probs=True)
    assert ids.shape == lp.shape == (0,)
    hidden, weight, _ = random_problem(gen, 3, 100, 16)
    ids, lp = localargmax.lm_head_argmax(hidden, weight, return_log_probs=True)
    assert torch.equal(ids, localargmax.lm_head_argmax(hidden, weight))
    _check_log_probs(lp, ids, ref_log_probs(ref_logits(hidden, weight)), 1e-5, "world size 1")


def test_log_probs_bad_arguments_name_them(gen):
    hidden, weight, _ = random_problem(gen, 2, 10, 4)
    cases = [
        (dict(return_log_probs=True, reduce="all_reduce"), ValueError, "reduce='all_gather'"),
        (dict(return_log_probs=1), TypeError, "return_log_probs must be a bool"),
        (dict(return_log_probs=True, logit_scale=0.0), ValueError, "scale must be a finite float > 0"),
        (dict(return_log_probs=True, logit_scale=math.nan), ValueError, "scale must be a finite float > 0"),
        (dict(return_log_probs=True, logit_scale=1e-50), ValueError, "scale must be >= 2**-126"),
        (dict(return_log_probs=True, soft_cap=-1.0), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(return_log_probs=True, soft_cap=math.inf), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(logit_scale=2.0), ValueError, "return_log_probs=True"),
        (dict(soft_cap=2.0), ValueError, "return_log_probs=True"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=re.escape(match)):
            localargmax.lm_head_argmax(hidden, weight, **kw)
        if "reduce" in kw:  # top-k always all-gathers
            continue
        with pytest.raises(exc, match=re.escape(match)):
            localargmax.lm_head_topk(hidden, weight, 2, **kw)
        if "return_log_probs" not in kw:  # sampling takes a transform alone: it changes the samples
            localargmax.lm_head_sample(hidden, weight, temperature=1.0, seed=0, **kw)
            continue
        with pytest.raises(exc, match=re.escape(match)):
            localargmax.lm_head_sample(hidden, weight, temperature=1.0, seed=0, **kw)


def test_ranks_that_disagree_on_log_probs_raise(gen):
    """One rank frames pairs, the other does not, with payloads of the same
    length (argmax + pairs == top-2 keys): the header's pairs flag makes every
    rank raise, naming the cause."""
    hidden, weight, _ = random_problem(gen, 3, 16, 4)
    with_pairs = localargmax.shard_argmax(hidden, weight, log_partition=True)
    top2 = localargmax.shard_topk(hidden, weight, 2)
    frames = stack_frames([with_pairs, top2], [(0, 16), (0, 16)])
    with pytest.raises(ValueError, match="disagree on whether this step exchanges log-partition pairs"):
        localargmax.lm_head_argmax(hidden, weight, return_log_probs=True, group=lambda x: frames)
    with pytest.raises(ValueError, match="disagree on whether this step exchanges log-partition pairs"):
        localargmax.lm_head_topk(hidden, weight, 2, group=lambda x: frames)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_log_probs_under_torch_compile_fullgraph(gen, backend):
    """return_log_probs under torch.compile(fullgraph=True): the fake kernels
    of the _lse ops, the framed pairs (bit-cast views) and the merge trace;
    the same ids and log-probabilities as eager (the merge's float32 ops may
    fuse differently: within 1e-6)."""
    torch._dynamo.reset()
    hidden, weight = torch.randn(5, 40, generator=gen), torch.randn(320, 40, generator=gen)

    def step(h, w):
        a = localargmax.lm_head_argmax(h, w, num_valid=300, return_log_probs=True, soft_cap=20.0)
        t = localargmax.lm_head_topk(h, w, 3, num_valid=300, return_log_probs=True, logit_scale=0.5)
        s = localargmax.lm_head_sample(h, w, temperature=0.7, seed=1, num_valid=300, return_log_probs=True)
        return a, t, s

    got = torch.compile(step, fullgraph=True, backend=backend)(hidden, weight)
    want = step(hidden, weight)
    for (gi, gl), (wi, wl) in zip(got, want):
        assert torch.equal(gi, wi) and torch.allclose(gl, wl, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- log_probs_from_pairs


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_log_probs_from_pairs_are_the_steps_merge_bits(gen, tp):
    """log_probs_from_pairs (the steps that merge in Python: the filtered
    sampler's rows) against merge_frames (the planned step) on the same
    frames: the same bits at every batch size (a vectorised exp and a scalar
    one differ in the last bit, so a torch formula would not hold: issue 67's
    CI failure), every temperature, a rank all -inf, a NaN row, refs tied
    across ranks; [B, k] values too. And the float64 log_softmax of the full
    logits within the documented bound."""
    for batch in (1, 3, 16, 17, 33, 70):
        vocab = int(torch.randint(100, 400, (1,), generator=gen))
        hidden, weight, _ = random_problem(gen, batch, vocab, 24)
        hidden = hidden * 3
        shards = make_shards(weight, None, tp, 64, hidden=hidden)
        outs = [
            localargmax.shard_argmax(hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, log_partition=True)
            for w, _, s in shards
        ]
        keys = [k for k, _ in outs]
        pairs = torch.stack([p for _, p in outs])
        if tp > 1:
            pairs[0, 0] = torch.tensor([-math.inf, 0.0])  # row 0: rank 0 all -inf
            pairs[1, -1, 0] = pairs[0, -1, 0]  # last row: refs tied across ranks
        if batch > 2:
            pairs[-1, 1, 0] = math.nan  # row 1: a NaN logit on the last rank
        t = torch.rand(batch, generator=gen) * 3
        t[::4] = 0.0
        frames = stack_frames(list(zip(keys, pairs)), [(s.vocab_start, s.num_valid) for _, _, s in shards])
        for temperature in (None, t):
            _, values, want, _, _ = torch.ops.localargmax.merge_frames.default(
                frames, batch, 1, True, 0, None, 0, temperature, True, False, False, False
            )
            got = localargmax.log_probs_from_pairs(values, pairs, temperature)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (batch, tp, got, want)
            wide = torch.stack([values, values - 1.5, values * 0.5], dim=1)
            got_k = localargmax.log_probs_from_pairs(wide, pairs, temperature)
            assert torch.equal(got_k[:, 0].view(torch.int32), want.view(torch.int32))
            assert torch.equal(got_k[:, 1].isnan(), want.isnan())
        clean = torch.stack(  # the pairs at the rows' temperatures, nothing planted: the float64 reference
            [
                localargmax.shard_argmax(
                    hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, log_partition=True, temperature=t
                )[1]
                for w, _, s in shards
            ]
        )
        _, values = localargmax.merge_keys(torch.stack(keys))
        got = localargmax.log_probs_from_pairs(values, clean, t)
        scaled = ref_logits(hidden, weight) / torch.where(t > 0, t, 1.0).double()[:, None]
        ref = values.double() / torch.where(t > 0, t, 1.0).double() - torch.logsumexp(scaled, dim=1)
        tol = log_prob_tolerance(hidden, weight, None, 1.0, None, t, tp=tp)
        err = float((got.double() - ref).abs().max())
        assert err <= tol, f"batch {batch}, tp {tp}: log-prob error {err:.3g} > {tol:.3g}"


def test_log_probs_from_pairs_bad_input(gen):
    """Wrong dtypes, shapes and devices raise naming the argument; opcheck."""
    values, pairs, t = torch.randn(4, generator=gen), torch.randn(2, 4, 2, generator=gen), torch.ones(4)
    pairs[..., 1] = pairs[..., 1].abs() * 10  # others >= 0: a finite log S (opcheck compares without NaN)
    cases = [
        ((values.double(), pairs, t), TypeError, "values and pairs must be float32"),
        ((values, pairs.half(), t), TypeError, "values and pairs must be float32"),
        ((values, pairs, t.double()), TypeError, "temperature must be float32"),
        ((values[None, None], pairs, t), ValueError, "values must be [B] or [B, k]"),
        ((values, pairs[:, :3], t), ValueError, "pairs must be [tp >= 1, B=4, 2]"),
        ((values, pairs[:0], t), ValueError, "pairs must be [tp >= 1, B=4, 2]"),
        ((values, pairs, t[:3]), ValueError, "temperature must be [B=4]"),
        ((values, pairs.to("meta"), t), ValueError, "pairs must be on values' device"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=re.escape(match)):
            localargmax.log_probs_from_pairs(*args)
    for args in [(values, pairs, t), (values, pairs, None), (values[:0], pairs[:, :0], t[:0]),
                 (torch.randn(4, 3, generator=gen), pairs, t)]:  # fmt: skip
        torch.library.opcheck(torch.ops.localargmax.log_probs_from_pairs.default, args)
