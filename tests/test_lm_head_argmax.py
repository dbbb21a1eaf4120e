"""lm_head_argmax across real gloo ranks (spawned processes): tp = 1..4,
both reduce modes, d2t, ties across ranks, NaN on a later rank, padding that
would win, empty shards, batch == tp and batch 0. Every rank must return the
same ids, equal to the float64 reference on the full unsharded lm_head."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import localargmax
from helpers import RankFailure, ref_argmax, run_ranks
from multirank import REDUCES, SCENARIO_NAMES, TPS, check_case


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("tp", TPS)
def test_lm_head_argmax_multirank(multirank_run, tp, name, reduce):
    check_case(multirank_run, tp, name, reduce)


def test_scenarios_are_hard_enough(multirank_run):
    """The scenarios really contain what their names promise."""
    from helpers import build_shards

    _, scenarios, _ = multirank_run
    sc = scenarios["ties_across_ranks"]
    for tp in (2, 3, 4):
        shards = build_shards(sc.weight, sc.bias, tp, sc.pad_to)
        holders = {r for r, (_, _, s) in enumerate(shards) for c in (300, 520, 700, 998)
                   if s.vocab_start <= c < s.vocab_start + s.num_valid}
        assert len(holders) >= 2, f"tp={tp}: the tie is not across ranks"
    sc = scenarios["nan_on_later_rank"]
    for tp in (2, 3, 4):
        shards = build_shards(sc.weight, sc.bias, tp, sc.pad_to)
        assert shards[-1][2].vocab_start <= 990 or shards[-2][2].vocab_start <= 990
        assert shards[0][2].vocab_start + shards[0][2].num_valid <= 990
    for name in ("planted_f16_inf_bias_pad", "padding_would_win_bf16", "all_neg_inf"):
        sc = scenarios[name]
        shards = build_shards(sc.weight, sc.bias, 4, sc.pad_to)
        assert any(s.num_valid < s.rows for _, _, s in shards), name
    sc = scenarios["padding_would_win_bf16"]
    assert [s.num_valid for _, _, s in build_shards(sc.weight, sc.bias, 4, sc.pad_to)] == [32, 32, 6, 0]
    assert scenarios["batch_equals_tp"].hidden.shape[0] == 4
    assert scenarios["batch_zero"].hidden.shape[0] == 0


# ---------------------------------------------------------------------------
# World size 1 in-process, and the launcher itself
# ---------------------------------------------------------------------------


def test_world_size_one_without_group(gen):
    hidden = torch.randn(9, 50, generator=gen)
    weight = torch.randn(300, 50, generator=gen)
    weight[250:] = float("nan")
    for reduce in REDUCES:
        ids = localargmax.lm_head_argmax(hidden, weight, num_valid=250, reduce=reduce)
        assert torch.equal(ids, ref_argmax(hidden, weight[:250]))
    keys = localargmax.shard_argmax(hidden, weight, num_valid=250)
    assert torch.equal(localargmax.exchange_keys(keys), keys.unsqueeze(0))


def _raise_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # rank 0 would wait here forever
    return rank


def _exit_without_reporting(rank, world):
    os._exit(3)


def _hang(rank, world):
    time.sleep(1000)


def test_launcher_propagates_rank_exception():
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"(?s)rank 1 raised.*ValueError: boom from rank 1"):
        run_ranks(_raise_on_rank_1, 2, timeout=120)
    assert time.monotonic() - start < 100


def test_launcher_reports_a_crashed_rank():
    with pytest.raises(RankFailure, match="rank 0 exit code 3"):
        run_ranks(_exit_without_reporting, 1, timeout=120)


def test_launcher_times_out_on_hang():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="did not finish within"):
        run_ranks(_hang, 1, timeout=4)
    assert time.monotonic() - start < 40
