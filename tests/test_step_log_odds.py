"""lm_head_argmax(return_log_odds=True, temperature=T): the argmax's log-odds
``-log Σ_{z ≠ argmax} exp((x_z - x_max) / T)`` (what vLLM's adaptive
verification reads) against a float64 direct sum on the full unsharded
logits, across simulated ranks with per-row temperatures, every transform,
fp32 and bf16; the confident row that ``total - 1`` loses; exact ties across
ranks; NaN / +-inf / all -inf rows; d2t; the combination with
return_log_probs; the shard op's pair at a temperature; bad arguments."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.problems import (
    integer_problem,
    make_shards,
    random_problem,
    simulated_argmax,
    simulated_argmax_log_odds,
)
from tests.support.reference import log_prob_tolerance, ref_log_odds, ref_log_probs, ref_logits, ref_transform

TRANSFORMS = {"plain": {}, "scale": {"logit_scale": 0.37}, "both": {"logit_scale": 1.7, "soft_cap": 4.0}}
TEMPERATURES = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.05, 7.0, -1.0])  # 0 and -1: T = 1 (vLLM's rule)


def _check(got, want, tol, context):
    """NaN and +inf exactly where the reference has them, the rest within
    tol; past 80 (the others' float32 sum below e^-80, near the end of the
    normal range) only ``>= 79`` (or +inf) is required."""
    got = got.double()
    assert torch.equal(got.isnan(), want.isnan()), (context, got, want)
    huge = want > 80
    assert bool((got[huge] >= 79).all()), (context, got, want)
    got, want = got[~huge], want[~huge]
    assert torch.equal(got == math.inf, want == math.inf), (context, got, want)
    finite = want.isfinite()
    err = float((got[finite] - want[finite]).abs().max()) if bool(finite.any()) else 0.0
    assert err <= tol, f"{context}: log-odds error {err:.3g} > {tol:.3g}"
    return err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("tp", [1, 2, 3])
@pytest.mark.parametrize("case", list(TRANSFORMS))
def test_log_odds_match_float64_across_simulated_ranks(gen, dtype, tp, case):
    """Random problems (an uneven vocabulary, padding that would dominate if
    counted, a bias, pad_to 256 leaving later ranks empty), per-row
    temperatures (0 and -1 meaning 1) and a Python float one: the ids are
    lm_head_argmax's, the log-odds within the float32 bound of float64's
    direct sum, and with return_log_probs the log-probabilities are those of
    softmax(x / T), from the same pairs."""
    lp = TRANSFORMS[case]
    scale, cap = lp.get("logit_scale", 1.0), lp.get("soft_cap")
    vocab = int(torch.randint(300, 1500, (1,), generator=gen))
    hidden, weight, bias = random_problem(gen, 7, vocab, 48, dtype, bias="float32")
    hidden = (hidden.float() * 3).to(dtype)  # logits ~N(0, 9): confident and flat rows
    logits = ref_logits(hidden, weight, bias)
    for temperature in (TEMPERATURES, 0.8, None):
        t = temperature if isinstance(temperature, torch.Tensor) else None
        if isinstance(temperature, float):
            t = torch.full((7,), temperature)
        tol = log_prob_tolerance(hidden, weight, bias, scale, cap, t, tp=tp)
        for pad_to in (1, 256):
            shards = make_shards(weight, bias, tp, pad_to, hidden=hidden)
            ids, odds = simulated_argmax_log_odds(hidden, shards, temperature, **lp)
            if not lp:  # a transform may round two logits into a tie; untransformed: the argmax's ids
                assert torch.equal(ids, simulated_argmax(hidden, shards))
            _check(odds, ref_log_odds(logits, ids, scale, cap, t), tol, f"{case} T={temperature} pad_to={pad_to}")
            ids2, probs, odds2 = simulated_argmax_log_odds(hidden, shards, temperature, log_probs=True, **lp)
            assert torch.equal(ids2, ids) and torch.equal(odds2.view(torch.int32), odds.view(torch.int32))
            want = ref_log_probs(logits, scale, cap, t).gather(1, ids[:, None])[:, 0]
            assert float((probs.double() - want).abs().max()) <= tol, "log-probs at T"


def test_the_confident_row_that_total_minus_one_loses():
    """The issue's row: 10,000 logits from N(0, 3²), one set to 60, T = 0.7,
    on 2 ranks. vLLM's feature -log(total - 1) has no digits left (total
    rounds to 1 even in float64); the direct sum over the others keeps them:
    67.17, as float64's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=g) * 3
    x[1234] = 60.0
    weight = torch.zeros(10_000, 4)
    weight[:, 0] = x
    hidden = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # logits = x exactly
    t = torch.tensor([0.7])
    y = x.double() / 0.7
    total = torch.exp(y - y.max()).sum()
    assert float(total - 1) == 0.0  # vLLM's formula, even in float64
    want = float(-torch.logsumexp(torch.cat([y[:1234], y[1235:]]) - y[1234], 0))
    assert abs(want - 67.17) < 0.01
    ids, odds = simulated_argmax_log_odds(hidden, make_shards(weight, None, 2, 64), t)
    assert int(ids) == 1234
    assert abs(float(odds) - want) <= 1e-4 * want, (float(odds), want)


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_exact_ties_across_ranks_give_non_positive_log_odds(gen, tp):
    """Integer logits with the maximum copied into other rows (other ranks
    too): the smallest id wins, its log-odds is -log(ties + rest) <= 0,
    exactly the float64 direct sum's (within rounding), at T = 1 and 0.6."""
    hidden, weight, bias = integer_problem(gen, 6, 300, 16, bias=True, ties=False)
    logits = ref_logits(hidden, weight, bias)
    top = logits.argmax(dim=1)
    for b in range(6):  # plant copies of row b's winner in later rows, across shards
        for j in ((int(top[b]) + 151 + b) % 300, 299 - b):
            if j != int(top[b]):
                weight[j], bias[j] = weight[top[b]], bias[top[b]]
    logits = ref_logits(hidden, weight, bias)
    tied = (logits == logits.max(dim=1, keepdim=True).values).sum(dim=1) > 1
    assert int(tied.sum()) >= 3  # a copy can overwrite another row's winner; most rows keep a tie
    for t in (None, torch.full((6,), 0.6)):
        ids, odds = simulated_argmax_log_odds(hidden, make_shards(weight, bias, tp, 64), t)
        assert torch.equal(ids, logits.argmax(dim=1))
        assert bool((odds[tied] <= 0).all()), (odds, tied)
        _check(odds, ref_log_odds(logits, ids, temperature=t), 1e-5, f"ties tp={tp}")


def test_log_odds_specials():
    """A NaN logit (NaN), an all -inf row (NaN), a +inf logit (NaN, as
    vLLM's estimator and log_softmax), a row whose others are all -inf
    (+inf: certain), a vocabulary of one id (+inf), batch 0."""
    weight = torch.eye(4).repeat(40, 1)[:150]  # 150 rows, H = 4
    hidden = torch.zeros(5, 4)
    bias = torch.zeros(150)
    shards = lambda b: make_shards(weight, b, 3, 64)  # noqa: E731
    b = bias.clone()
    b[77] = math.nan
    _, odds = simulated_argmax_log_odds(hidden[:1], shards(b))
    assert odds.isnan().all()
    b = torch.full((150,), -math.inf)
    _, odds = simulated_argmax_log_odds(hidden[:1], shards(b))
    assert odds.isnan().all()
    b = bias.clone()
    b[100] = math.inf
    ids, odds = simulated_argmax_log_odds(hidden[:1], shards(b))
    assert int(ids) == 100 and odds.isnan().all()
    b = torch.full((150,), -math.inf)
    b[140] = 2.0
    ids, odds = simulated_argmax_log_odds(hidden[:1], shards(b))
    assert int(ids) == 140 and odds.tolist() == [math.inf]
    ids, odds = localargmax.lm_head_argmax(hidden[:2], weight[:1], return_log_odds=True)
    assert ids.tolist() == [0, 0] and odds.tolist() == [math.inf, math.inf]
    ids, odds = localargmax.lm_head_argmax(hidden[:0], weight, return_log_odds=True, temperature=0.5)
    assert ids.shape == (0,) and odds.shape == (0,) and odds.dtype == torch.float32


def test_log_odds_with_d2t_are_the_draft_argmax_log_odds(gen):
    """With d2t the ids are target ids and the log-odds unchanged."""
    hidden, weight, bias = random_problem(gen, 5, 500, 32, bias="float32")
    d2t = torch.randint(0, 50, (500,), generator=gen)
    t = torch.rand(5, generator=gen) + 0.2
    shards = make_shards(weight, bias, 2, 64)
    ids, odds = simulated_argmax_log_odds(hidden, shards, t)
    tids, todds = simulated_argmax_log_odds(hidden, shards, t, d2t=d2t)
    assert torch.equal(tids, ids + d2t[ids]) and torch.equal(todds, odds)


def test_shard_pair_at_a_temperature_is_the_direct_sum(gen):
    """shard_argmax(log_partition=True, temperature=T): ref is the key's
    value, others the float64 sum over the other valid rows of
    exp((x - ref) / T) (T <= 0: 1) within the float32 bound; the keys are
    the argmax's whatever T; every CPU path this CPU has gives them."""
    hidden, weight, bias = random_problem(gen, 7, 333, 40, bias="float32")
    t = TEMPERATURES.clone()
    keys, pairs = localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=300, log_partition=True, temperature=t)
    assert torch.equal(keys, localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=300))
    ids, values = localargmax.decode_keys(keys)
    assert torch.equal(pairs[:, 0], values)
    x = ref_transform(ref_logits(hidden, weight[:300], bias[:300]))
    want = torch.exp(-ref_log_odds(x, ids, temperature=t))
    tol = log_prob_tolerance(hidden, weight[:300], bias[:300], temperature=t)
    _check(-pairs[:, 1].log(), -want.log(), tol, "shard pair at T")
    ones = localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=300, log_partition=True)[1]
    greedy = t <= 0
    assert torch.equal(pairs[greedy | (t == 1)], ones[greedy | (t == 1)])


def test_payload_length_counts_one_word_per_row_for_log_odds():
    for batch in (0, 1, 7):
        base = localargmax.payload_length(batch)
        assert localargmax.payload_length(batch, log_odds=True) == base + batch
        assert localargmax.payload_length(batch, log_probs=True, log_odds=True) == base + batch


BAD = {
    "temperature without log-odds": (dict(temperature=0.7), ValueError, "pass return_log_odds=True"),
    "nan float": (dict(return_log_odds=True, temperature=math.nan), ValueError, "temperature must be a finite float"),
    "inf tensor": (
        dict(return_log_odds=True, temperature=torch.tensor([1.0, math.inf])),
        ValueError,
        "temperature must be finite",
    ),
    "int tensor": (dict(return_log_odds=True, temperature=torch.ones(2, dtype=torch.int32)), TypeError, "float32"),
    "wrong length": (dict(return_log_odds=True, temperature=torch.ones(3)), ValueError, r"1-D \[batch=2\]"),
    "bool flag": (dict(return_log_odds=1), TypeError, "return_log_odds must be a bool"),
    "all_reduce": (dict(return_log_odds=True, reduce="all_reduce"), ValueError, "return_log_odds=True needs"),
    "string": (dict(return_log_odds=True, temperature="hot"), ValueError, "temperature must be a finite float"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_log_odds_arguments(name):
    kw, exc, match = BAD[name]
    with pytest.raises(exc, match=match):
        localargmax.lm_head_argmax(torch.ones(2, 8), torch.ones(16, 8), **kw)


def test_shard_op_temperature_needs_the_log_partition():
    h, w = torch.ones(2, 8), torch.ones(16, 8)
    with pytest.raises(ValueError, match="temperature is the log-partition's"):
        localargmax.shard_argmax(h, w, temperature=torch.ones(2))
    with pytest.raises(ValueError, match=r"shard_argmax: temperature must be 1-D \[batch=2\]"):
        localargmax.shard_argmax(h, w, log_partition=True, temperature=torch.ones(3))
    with pytest.raises(TypeError, match="shard_argmax: temperature must be float32"):
        localargmax.shard_argmax(h, w, log_partition=True, temperature=torch.ones(2, dtype=torch.float64))
