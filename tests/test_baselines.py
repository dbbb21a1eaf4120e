"""baselines.py, what engines do today: full_gather_argmax / _topk / _sample
(torch ops on the all-gathered logits) and unfused_local_argmax (float32
indices: refuses vocabularies of 2**24 rows or more instead of returning wrong
ids), in one process and across gloo ranks."""

from __future__ import annotations

import pytest
import torch

import localargmax.baselines as baselines
from localargmax import build_d2t
from localargmax.baselines import full_gather_argmax, full_gather_sample, full_gather_topk, unfused_local_argmax
from tests.support.launch import run_ranks
from tests.support.problems import integer_problem, make_shards, planted_problem
from tests.support.reference import min_gap, ref_argmax
from tests.support.scenarios import BASELINES, SCENARIO_NAMES, TPS, check_case

ARGMAX = {"full_gather_argmax": full_gather_argmax, "unfused_local_argmax": unfused_local_argmax}


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("bias", [None, "float32", "weight"], ids=["nobias", "bias_f32", "bias_wdtype"])
def test_single_rank_well_separated(gen, baseline, dtype, bias):
    """Planted winners separated far beyond 16-bit rounding of the logits (the
    baselines compute logits in the weight dtype); one shard padded to 1152
    rows with rows that would win; with and without d2t."""
    fn = ARGMAX[baseline]
    for _ in range(20):  # a plant can land near another row's (rarely): draw again until every gap is wide
        hidden, weight, b, winners = planted_problem(gen, 9, 1100, 64, dtype, bias)
        if min_gap(hidden, weight, b) > 0.05:
            break
    assert min_gap(hidden, weight, b) > 0.05, "no well-separated draw in 20"
    d2t = build_d2t(torch.randint(0, 1000, (3000,), generator=gen), 1100)
    ((w, bb, s),) = make_shards(weight, b, 1, 128, hidden=hidden)
    assert s.rows == 1152 and s.num_valid == 1100
    assert torch.equal(fn(hidden, w, num_valid=s.num_valid, bias=bb), winners)
    assert torch.equal(fn(hidden, w, num_valid=s.num_valid, bias=bb, d2t=d2t), ref_argmax(hidden, weight, b, d2t))


@pytest.mark.parametrize("baseline", BASELINES)
def test_single_rank_nan_and_all_neg_inf(gen, baseline):
    fn = ARGMAX[baseline]
    hidden, weight, bias = (
        torch.randn(4, 16, generator=gen),
        torch.randn(200, 16, generator=gen),
        torch.randn(200, generator=gen),
    )
    bias[[150, 170]] = float("nan")
    assert fn(hidden, weight, bias=bias).tolist() == [150] * 4
    assert fn(hidden, weight, num_valid=120, bias=torch.full((200,), float("-inf"))).tolist() == [0] * 4


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("tp", TPS)
def test_baselines_multirank(multirank_run, tp, name, baseline):
    """The scenarios of test_step.py where the data is clear enough for logits
    rounded to the weight dtype (and not built on exact ties of float32 GEMM
    results, which these baselines do not promise)."""
    if not multirank_run[1][name].baselines:
        pytest.skip(f"{name}: near-ties / exact ties are outside what the baselines promise")
    check_case(multirank_run, tp, name, baseline)


def _big_zero_stride_problem(winner: int, rows: int = 2**24 + 64, hsize: int = 4):
    """A [rows, H] lm_head that costs no memory (a zero-stride view) and a bias that makes ``winner`` win."""
    bias = torch.zeros(rows)
    bias[winner] = 1.0
    return torch.randn(3, hsize), torch.zeros(1, hsize).expand(rows, hsize), bias


def test_float32_index_guard(monkeypatch):
    """Fault family, indices carried as floats: at 2**24 + 64 rows with the
    winner at 2**24 + 1, lm_head_argmax, lm_head_topk and full_gather_argmax
    are exact; unfused_local_argmax refuses naming 2**24 (with or without
    num_valid), accepts and is exact just below the limit, and without the
    guard it would indeed return a wrong id."""
    import localargmax

    winner = 2**24 + 1
    assert float(torch.tensor(winner, dtype=torch.float32)) != winner  # the fault itself
    hidden, weight, bias = _big_zero_stride_problem(winner)
    assert localargmax.lm_head_argmax(hidden, weight, bias=bias).tolist() == [winner] * 3
    assert localargmax.lm_head_topk(hidden, weight, 2, bias=bias)[0][:, 0].tolist() == [winner] * 3
    assert full_gather_argmax(hidden, weight, bias=bias).tolist() == [winner] * 3
    for kwargs in ({}, {"num_valid": 100}):
        with pytest.raises(ValueError, match=r"2\*\*24"):
            unfused_local_argmax(hidden, weight, bias=bias, **kwargs)
    below = baselines.FLOAT32_EXACT_INDEX_LIMIT
    h2, w2, b2 = _big_zero_stride_problem(below - 1, rows=below)
    assert unfused_local_argmax(h2, w2, bias=b2).tolist() == [below - 1] * 3
    monkeypatch.setattr(baselines, "FLOAT32_EXACT_INDEX_LIMIT", 2**40)
    assert unfused_local_argmax(hidden, weight, bias=bias).tolist() == [2**24] * 3, "float32 should round 2**24 + 1"


def test_unfused_refuses_inexact_float32_index_multirank(multirank_run):
    """tp = 4 ranks of 2**22 + 1 rows each: every rank raises ValueError."""
    for rank, results in enumerate(multirank_run[2]):
        got = results[(4, "too_big", "unfused_local_argmax")]
        assert got.startswith("ValueError:") and "2**24" in got, f"rank {rank}: {got}"


# ----------------------------------------------------------------------------- top-k and sampling baselines

VOCAB, HSIZE, BATCH = 333, 11, 5


def distinct_problem(gen):
    """Integer hidden / weight plus a bias of distinct multiples of 100: every
    logit is an exact float32 integer and all logits of a row differ, so the
    top-k order is unique and exact."""
    hidden, weight, _ = integer_problem(gen, BATCH, VOCAB, HSIZE, ties=False)
    return hidden, weight, torch.randperm(VOCAB, generator=gen).float() * 100


def test_topk_single_rank_matches_torch_topk(gen):
    hidden, weight, bias = distinct_problem(gen)
    ((w, b, s),) = make_shards(weight, bias, 1, 64, hidden=hidden)
    d2t = build_d2t(torch.randint(0, 1000, (3000,), generator=gen), VOCAB)
    want = (hidden @ weight.T + bias).topk(7, dim=1)
    ids, values = full_gather_topk(hidden, w, 7, num_valid=s.num_valid, bias=b)
    assert torch.equal(ids, want.indices) and torch.equal(values, want.values)
    assert torch.equal(
        full_gather_topk(hidden, w, 7, num_valid=s.num_valid, bias=b, d2t=d2t)[0], want.indices + d2t[want.indices]
    )
    bf16, _ = full_gather_topk(hidden.bfloat16(), w.bfloat16(), 3, num_valid=s.num_valid)
    assert bf16.dtype == torch.int64 and bf16.shape == (BATCH, 3) and bool((bf16 < VOCAB).all())


def test_sample_single_rank(gen):
    hidden, weight, bias = distinct_problem(gen)
    ((w, b, s),) = make_shards(weight, bias * 0.01, 1, 64, hidden=hidden)
    assert torch.equal(
        full_gather_sample(hidden, w, temperature=0, num_valid=s.num_valid, bias=b),  # T = 0 is greedy
        full_gather_argmax(hidden, w, num_valid=s.num_valid, bias=b),
    )
    draws = [
        full_gather_sample(
            hidden, w, temperature=2.0, num_valid=s.num_valid, bias=b, generator=torch.Generator().manual_seed(5)
        )
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1]) and bool((draws[0] < VOCAB).all())  # same seed, no padding drawn
    h = (torch.randn(1, HSIZE, generator=gen) * 0.3).expand(40000, HSIZE).contiguous()  # one row, many draws
    wr = torch.randn(VOCAB, HSIZE, generator=gen)
    probs = torch.softmax((h[0] @ wr.T) / 1.5, dim=0)
    got = full_gather_sample(h, wr, temperature=1.5, generator=gen)
    assert float((torch.bincount(got, minlength=VOCAB).double() / got.numel() - probs.double()).abs().max()) < 0.01


def _topk_sample_worker(rank, world_size, seed):
    import torch.distributed as dist

    hidden, weight, bias = distinct_problem(torch.Generator().manual_seed(seed))
    w, b, s = make_shards(weight, bias, world_size, 64, hidden=hidden)[rank]
    kw = dict(vocab_start=s.vocab_start, num_valid=s.num_valid, group=dist.group.WORLD)
    ids, values = full_gather_topk(hidden, w, 9, bias=b, **kw)
    sampled = full_gather_sample(
        hidden, w, temperature=30.0, bias=b / 100, generator=torch.Generator().manual_seed(seed), **kw
    )
    return ids.tolist(), values.tolist(), sampled.tolist()


def test_topk_and_sample_on_gloo_ranks(seed):
    hidden, weight, bias = distinct_problem(torch.Generator().manual_seed(seed))
    want = (hidden @ weight.T + bias).topk(9, dim=1)
    results = run_ranks(_topk_sample_worker, 3, seed)
    for ids, values, sampled in results:
        assert ids == want.indices.tolist() and values == want.values.tolist()
        assert sampled == results[0][2] and max(sampled) < VOCAB  # same seed, same draw; padding never drawn


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("baseline", BASELINES)
def test_argmax_baselines_reject_bad_layout_and_group(baseline):
    fn, hidden, weight = ARGMAX[baseline], torch.randn(2, 4), torch.randn(8, 4)
    with pytest.raises(ValueError, match="vocab_start"):
        fn(hidden, weight, vocab_start=3)
    with pytest.raises(TypeError, match="group"):
        fn(hidden, weight, group="world")
    with pytest.raises(TypeError, match="dtype"):
        fn(hidden, weight.bfloat16())


def test_topk_and_sample_baselines_reject_bad_arguments():
    hidden, weight = torch.randn(2, 8), torch.randn(100, 8)
    for bad in (0, 101, 2.0, True):
        with pytest.raises(ValueError, match="k must be"):
            full_gather_topk(hidden, weight, bad)
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="temperature"):
            full_gather_sample(hidden, weight, temperature=bad)
    with pytest.raises(TypeError, match="dtype"):
        full_gather_topk(hidden.double(), weight, 3)
    with pytest.raises(ValueError, match="layout"):
        full_gather_sample(hidden, weight, temperature=1.0, vocab_start=3)
