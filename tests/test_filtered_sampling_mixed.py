"""Filtered and plain rows in one batch (issue 54, items 4-6): rows with
every filter off are sampled from the ranks' noised best keys, sent in the
filtered step's exchange, so they never need the fallback and equal the
unfiltered lm_head_sample exactly; top-p at T > 1 is bounded (it falls back
only where the candidates cannot decide); the soft-cap and scale are one rule
for filtered and unfiltered sampling; LOCALARGMAX_DEBUG=1 catches per-row
arguments the ranks hold in another order."""

from __future__ import annotations

import math
import os

import pytest
import torch

import localargmax
from localargmax import _validation, engine, sampling
from tests.support.launch import run_ranks
from tests.support.problems import make_shards
from tests.test_filtered_sampling import check, problem, reference, run_tp

TEMPS = (0.7, 1.0, 1.3, 2.0)


def _mixed_batch(gen, tp, batch=32, vocab=2003):
    """The engine's batch of the issue: T cycling over TEMPS, top_k=20 on odd
    rows and 0 (off) on even rows, flat logits (sharp 0.3: an unfiltered
    row's winner is not certified by the candidates), a duplicated weight
    row on the first and last shard (an exact tie across ranks) and a zero
    hidden row (every logit 0: ties everywhere)."""
    hidden, weight = problem(gen, batch=batch, vocab=vocab, sharp=0.3)
    weight[vocab - 1] = weight[0]
    hidden[2] = 0.0
    t = torch.tensor([TEMPS[(b // 2) % len(TEMPS)] for b in range(batch)])
    k = torch.tensor([20 if b % 2 else 0 for b in range(batch)])
    return hidden, weight, t, k


@pytest.mark.parametrize("tp", [2, 4])
def test_mixed_batch_runs_under_fallback_error(seed, tp):
    """TP 2 and 4, 32 rows: no fallback; off rows (even) are the unfiltered
    lm_head_sample's ids (same seed and offset) bit for bit, with their
    log-probabilities; top-k rows are the float64 reference's. Before the
    noised best keys were sent, the off rows raised here."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight, t, k = _mixed_batch(gen, tp)
    kw = dict(temperature=t, seed=seed, offset=5)
    ids = run_tp(hidden, weight, tp, top_k=k, fallback="error", **kw)
    plain = run_tp(hidden, weight, tp, **kw)
    off = k == 0
    assert torch.equal(ids[off], plain[off])
    assert not torch.equal(ids[~off], plain[~off])  # the filter acts: the comparison above could fail
    ones = torch.ones(32, dtype=torch.float64)
    check(ids, hidden, weight, t, k, ones, 0 * ones, seed, 5)
    # the same with log-probabilities: off rows' ids and log-probabilities are the unfiltered step's bits
    ids_lp, lp = run_tp(hidden, weight, tp, top_k=k, fallback="error", return_log_probs=True, **kw)
    plain_ids, plain_lp = run_tp(hidden, weight, tp, return_log_probs=True, **kw)
    assert torch.equal(ids_lp, ids) and torch.equal(plain_ids, plain)
    torch.testing.assert_close(lp[off], plain_lp[off], rtol=0, atol=0)
    want = torch.log_softmax(hidden.double() @ weight.double().T / t[:, None].double(), dim=1)
    assert torch.allclose(lp[off].double(), want[off].gather(1, ids[off, None])[:, 0], atol=1e-5)


@pytest.mark.parametrize("tp", [2, 4])
def test_off_rows_at_any_temperature_with_transform_d2t_and_nan(seed, tp):
    """Off rows beside top-k (and top-k + top-p) rows at tiny to large T, with a
    soft-cap, a scale, d2t, padded shards and a NaN row: never the fallback,
    the unfiltered step's ids and log-probabilities."""
    gen = torch.Generator().manual_seed(seed)
    batch, vocab = 12, 1500
    hidden, weight = problem(gen, batch=batch, vocab=vocab, sharp=0.5)
    hidden[5, 0] = math.nan  # an off row whose every logit is NaN: id 0, as the argmax
    t = torch.tensor([1e-3, 0.3, 1.0, 2.0, 8.0, 1.0, 50.0, 0.0, 1.0, 0.9, 4.0, 1.0])
    k = torch.tensor([0] * 8 + [5, 30, 64, 3])
    p = torch.tensor([1.0] * 11 + [0.5])
    d2t = torch.randint(0, 50, (vocab,), generator=gen)
    kw = dict(temperature=t, seed=seed, offset=2**40, soft_cap=5.0, logit_scale=0.8, d2t=d2t, return_log_probs=True)
    ids, lp = run_tp(hidden, weight, tp, top_k=k, top_p=p, fallback="error", **kw)
    plain, plain_lp = run_tp(hidden, weight, tp, **kw)
    off = (k == 0) & (p == 1) & (t > 0)
    assert int(off.sum()) == 7 and bool(off[5])
    assert torch.equal(ids[off], plain[off])
    torch.testing.assert_close(lp[off], plain_lp[off], rtol=0, atol=0, equal_nan=True)  # the NaN row: NaN
    assert int(ids[5]) == int(d2t[0])  # the NaN row
    assert torch.equal(ids[7], plain[7])  # the greedy row


def _top_p_rows(gen, vocab):
    """Logits (float32, exact through an identity weight) of rows whose top-p
    nucleus at T > 1 lies inside the candidates (peaked: a few large values
    over N(0, 1)), and planted rows whose nucleus does at T = 1 but not at
    T = 2 (10 ids at 6, the rest near 0: at T = 2 the tail holds most of
    the mass)."""
    peaked = torch.randn(6, vocab, generator=gen)
    for r in range(6):
        top = torch.randperm(vocab, generator=gen)[:5]
        peaked[r, top] = torch.tensor([20.0, 19.0, 18.0, 17.0, 16.0]) + r / 7
    planted = torch.randn(2, vocab, generator=gen) * 0.01
    planted[:, torch.randperm(vocab, generator=gen)[:10]] = 6.0
    return peaked, planted


@pytest.mark.parametrize("tp", [2, 4])
def test_top_p_above_temperature_one_is_bounded(seed, tp):
    """Top-p alone at T in {1.3, 2}: peaked rows are decided by the
    candidates (fallback='error' runs; before the bound every T > 1 row fell
    back) and are the float64 reference's ids; planted rows whose nucleus
    reaches past the candidates at T = 2 take the fallback (a bound below the
    outsiders' true mass would decide them wrongly) and the gather gives the
    reference's ids (at T = 1 the candidates decide them)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = 1200
    peaked, planted = _top_p_rows(gen, vocab)
    eye = torch.eye(vocab)
    for temp in (1.3, 2.0):
        t, p = torch.full((6,), temp), torch.tensor([0.3, 0.5, 0.3, 0.5, 0.3, 0.5])
        ids = run_tp(peaked, eye, tp, temperature=t, seed=seed, top_p=p, fallback="error")
        ones = torch.ones(6, dtype=torch.float64)
        check(ids, peaked, eye, t, torch.zeros(6, dtype=torch.int64), p.double(), 0 * ones, seed, 0)
    p = torch.full((2,), 0.7)
    run_tp(planted, eye, tp, temperature=torch.ones(2), seed=seed, top_p=p, fallback="error")  # decided at T = 1
    t = torch.full((2,), 2.0)
    with pytest.raises(ValueError, match="fallback='gather'"):
        run_tp(planted, eye, tp, temperature=t, seed=seed, top_p=p, fallback="error")
    ids = run_tp(planted, eye, tp, temperature=t, seed=seed, top_p=p)
    want = reference(planted.double(), t, [0, 0], p.double(), [0.0, 0.0], seed, 0)
    assert [int(i) for i in ids] == [w for w, _ in want] and not any(near for _, near in want)


def test_decided_top_p_rows_match_float64_at_every_temperature(seed):
    """The step's own decision (``decide_rows``, from each shard's candidates
    and pairs) on random rows of varied sharpness, T from 0.5 to 4, p from
    0.2 to 0.95: every row it decides is the float64 reference's id (away
    from near-ties), and it decides rows at T > 1 (the test is not empty)."""
    gen = torch.Generator().manual_seed(seed)
    batch, vocab, tp = 48, 900, 3
    sharp = torch.tensor([1.0, 3.0, 6.0, 10.0]).repeat(batch // 4)[:, None]
    logits = torch.randn(batch, vocab, generator=gen) * sharp
    t = torch.tensor([0.5, 1.0, 1.3, 2.0, 4.0, 1.1]).repeat(batch // 6)
    p = torch.tensor([0.2, 0.5, 0.8, 0.95]).repeat_interleave(batch // 4).double()
    keys, pairs = [], []
    for w, _, s in make_shards(torch.eye(vocab), None, tp, 64):
        kk, pp = localargmax.shard_topk(
            logits, w, sampling.CANDIDATES, vocab_start=s.vocab_start, num_valid=s.num_valid, log_partition=True
        )
        keys.append(kk)
        pairs.append(pp)
    k, mp, rows = torch.zeros(batch, dtype=torch.int64), torch.zeros(batch, dtype=torch.float64), torch.arange(batch)
    draft, _, need = sampling.decide_rows(torch.stack(keys), torch.stack(pairs), t, k, p, mp, seed, rows, vocab)
    want = reference(logits.double(), t, k.tolist(), p, mp, seed, 0)
    decided = [b for b in range(batch) if not need[b] and not want[b][1]]
    assert [int(draft[b]) for b in decided] == [want[b][0] for b in decided]
    assert sum(1 for b in decided if t[b] > 1) >= 4, "no row at T > 1 was decided"
    assert bool(need.any()), "every row decided: the bound is never tested at its edge"


def test_soft_cap_is_one_rule_for_sampling(seed):
    """lm_head_sample takes logit_scale and soft_cap with or without filters
    and with or without log-probabilities: the Gumbel-max of the transformed
    logits (float64 reference), other ids than without them, the same ids
    with an off filter; lm_head_argmax still refuses them without
    log-probabilities (they do not change its ids)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=16, vocab=700, sharp=3.0)
    t = torch.tensor([0.7, 1.0, 1.5, 0.0] * 4)
    kw = dict(temperature=t, seed=seed, offset=9, soft_cap=5.0, logit_scale=1.5)
    ids = run_tp(hidden, weight, 2, **kw)
    x = torch.tanh(hidden.double() @ weight.double().T / 5.0) * 5.0 * 1.5
    want = reference(x, t, [0] * 16, [1.0] * 16, [0.0] * 16, seed, 9)
    exact = [b for b, (_, near) in enumerate(want) if not near]
    assert len(exact) >= 12 and [int(ids[b]) for b in exact] == [want[b][0] for b in exact]
    assert not torch.equal(ids, run_tp(hidden, weight, 2, temperature=t, seed=seed, offset=9))
    assert torch.equal(ids, run_tp(hidden, weight, 2, top_k=0, **kw))
    assert torch.equal(ids, run_tp(hidden, weight, 2, top_k=0, fallback="error", **kw))
    ids_lp, lp = run_tp(hidden, weight, 2, return_log_probs=True, **kw)
    assert torch.equal(ids_lp, ids)
    y = x / torch.where(t > 0, t, 1.0).double()[:, None]
    ref_lp = torch.log_softmax(y, dim=1).gather(1, ids[:, None])[:, 0]
    assert torch.allclose(lp.double(), ref_lp, atol=1e-5)
    with pytest.raises(ValueError, match="do not change the argmax or top-k ids"):
        localargmax.lm_head_argmax(hidden, weight, soft_cap=5.0)


def test_the_sampling_pass_runs_only_where_a_row_may_be_off():
    """Off the host (a meta tensor stands in for a device) the step cannot
    read the rows: it runs the sampling kernel unless a number turns a filter
    on (or the temperature off) for every row."""
    off = torch.zeros(4, dtype=torch.bool, device="meta")
    rows = torch.ones(4, dtype=torch.int64, device="meta")
    assert _validation._some_row_off(off, 1.0, rows, None, None)
    assert not _validation._some_row_off(off, 1.0, 5, None, None)
    assert not _validation._some_row_off(off, 1.0, None, 0.9, None)
    assert not _validation._some_row_off(off, 1.0, rows, None, 0.1)
    assert not _validation._some_row_off(off, 0.0, rows, None, None)
    assert _validation._some_row_off(off, 1.0, 0, 1.0, 0.0)
    assert not _validation._some_row_off(torch.zeros(4, dtype=torch.bool), 1.0, rows, None, None)  # host: read
    assert _validation._some_row_off(torch.tensor([False, True]), 1.0, rows, None, None)


PERMUTED = ("top_k", "top_p", "min_p", "temperature")


def _debug_worker(rank, world_size, seed):
    """2 gloo ranks with LOCALARGMAX_DEBUG=1: rank 1 holds one per-row
    argument with rows 0 and 1 swapped (the sums agree); every rank reports
    what it raised. Then the unswapped call, and the unfiltered step with
    swapped temperatures."""
    import torch.distributed as dist

    os.environ["LOCALARGMAX_DEBUG"] = "1"
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=6, vocab=400)
    w, _, s = make_shards(weight, None, world_size, 64, hidden=hidden)[rank]
    args = {
        "top_k": torch.tensor([40, 2, 20, 20, 8, 0]),
        "top_p": torch.tensor([0.9, 0.5, 1.0, 0.8, 1.0, 0.95]),
        "min_p": torch.tensor([0.1, 0.0, 0.05, 0.0, 0.2, 0.0]),
        "temperature": torch.tensor([0.7, 1.3, 1.0, 1.0, 0.5, 2.0]),
    }
    step = dict(vocab_start=s.vocab_start, num_valid=s.num_valid, group=dist.group.WORLD, seed=seed)
    out = {}

    def call(**kw):
        try:
            return localargmax.lm_head_sample(hidden, w, **step, **kw).tolist()
        except ValueError as e:
            return f"ValueError: {e}"

    for name in PERMUTED:
        mine = dict(args)
        if rank == 1:
            mine[name] = mine[name][[1, 0, 2, 3, 4, 5]]
        out[name] = call(**mine)
    out["same"] = call(**args)
    t = args["temperature"][[1, 0, 2, 3, 4, 5]] if rank == 1 else args["temperature"]
    out["unfiltered"] = call(temperature=t)
    return out


def test_debug_mode_names_permuted_per_row_arguments(seed):
    """LOCALARGMAX_DEBUG=1, 2 gloo ranks: a per-row argument whose rows one
    rank holds in another order (the issue: top_k [40, 2, ...] against [2,
    40, ...]) raises ValueError on every rank naming it; the same arguments
    run."""
    results = run_ranks(_debug_worker, 2, seed)
    for res in results:
        for name in PERMUTED:
            assert res[name].startswith(f"ValueError: LOCALARGMAX_DEBUG: ranks disagree on {name} "), (name, res)
        assert res["unfiltered"].startswith("ValueError: LOCALARGMAX_DEBUG: ranks disagree on temperature ")
        assert isinstance(res["same"], list) and res["same"] == results[0]["same"]


def test_fingerprint_follows_the_row_order():
    """The fingerprint differs for swapped rows and one changed value, not for -0.0 against 0.0."""
    fp = engine.fingerprint
    assert fp(torch.tensor([40, 2, 20])) != fp(torch.tensor([2, 40, 20]))
    assert fp(torch.tensor([0.7, 1.3])) != fp(torch.tensor([1.3, 0.7]))
    assert fp(torch.tensor([0.7, 1.3])) != fp(torch.tensor([0.7, 1.3000001]))
    assert fp(torch.tensor([2**62, 1])) != fp(torch.tensor([2**62 + 1, 1]))  # int64, not float64
    assert fp(torch.tensor([0.0, 1.0])) == fp(torch.tensor([-0.0, 1.0]))
