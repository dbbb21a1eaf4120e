"""layout.py: shard_vocab (the standard vocab-parallel layout, vLLM's
VocabParallelEmbedding) and check_layouts (load-time consistency across
ranks: every rank raises the same error naming the ranks)."""

from __future__ import annotations

import pytest
import torch

import localargmax
from localargmax import VocabShard, shard_vocab
from tests.support.launch import run_ranks, timed
from tests.support.strategies import given, settings, st


def _check_layout(vocab, tp, pad_to):
    shards = [shard_vocab(vocab, r, tp, pad_to) for r in range(tp)]
    assert all(isinstance(s, VocabShard) for s in shards)
    rows = shards[0].rows
    assert all(s.rows == rows for s in shards), "rows must be equal on every rank"
    for r, s in enumerate(shards):  # contiguous, disjoint, in rank order
        assert s.vocab_start == r * rows and 0 <= s.num_valid <= s.rows
    covered = [v for s in shards for v in range(s.vocab_start, s.vocab_start + s.num_valid)]
    assert covered == list(range(vocab))  # the valid parts cover [0, V) exactly once
    partial = [i for i, s in enumerate(shards) if s.num_valid < s.rows]
    assert all(shards[i].num_valid == 0 for i in partial[1:])  # after a padded shard come only empty ones
    padded = -(-vocab // pad_to) * pad_to
    assert rows * tp >= padded >= vocab
    if padded % tp == 0:
        assert rows * tp == padded
    else:
        assert rows * tp - padded < tp  # rows = ceil(padded / tp)


@settings(max_examples=400, deadline=None)
@given(
    vocab=st.integers(1, 300_000), tp=st.integers(1, 16), pad_to=st.sampled_from([1, 2, 3, 7, 8, 64, 128, 256, 1000])
)
def test_shard_vocab_properties(vocab, tp, pad_to):
    _check_layout(vocab, tp, pad_to)


def test_shard_vocab_small_exhaustive():
    for vocab in range(1, 140):
        for tp in range(1, 9):
            for pad_to in (1, 2, 5, 8, 64):
                _check_layout(vocab, tp, pad_to)


@pytest.mark.parametrize("vocab", [30522, 32000, 128256, 151936, 262144, 262145, 1, 63, 65])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_shard_vocab_matches_vllm_layout(vocab, tp):
    """vLLM VocabParallelEmbedding: padded = ceil(V / 64) * 64, rows = padded / tp."""
    padded = (vocab + 63) // 64 * 64
    if padded % tp:
        pytest.skip("tp does not divide the padded vocabulary")
    rows = padded // tp
    for rank in range(tp):
        assert shard_vocab(vocab, rank, tp) == (rank * rows, rows, max(0, min(rows, vocab - rank * rows)))


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 0, 1), "vocab_size"),
        ((10, 0, 0), "world_size"),
        ((10, 0, 2, 0), "pad_to"),
        ((10, 2, 2), "rank"),
        ((10, -1, 2), "rank"),
        ((10.0, 0, 2), "vocab_size"),
        ((10, True, 2), "rank"),
    ],
)
def test_shard_vocab_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        shard_vocab(*args)


LAYOUTS = {  # name: (tp, rank -> (shard, hidden_size), words every rank's error must contain, None = consistent)
    "consistent": (3, lambda r: (shard_vocab(1000, r, 3), 8), None),
    "rows_differ_tp2": (
        2,
        lambda r: (shard_vocab(1000, r, 2 if r == 0 else 3), 8),
        ["rows differs across ranks", "ranks [0]", "ranks [1]"],
    ),
    "pad_to_differs_tp3": (
        3,
        lambda r: (shard_vocab(1000, r, 3, 64 if r < 2 else 1), 8),
        ["rows differs across ranks", "ranks [0, 1]", "ranks [2]"],
    ),
    "hidden_differs": (
        3,
        lambda r: (shard_vocab(1000, r, 3), 8 if r != 1 else 16),
        ["hidden_size differs across ranks", "ranks [0, 2]", "ranks [1]"],
    ),
    "overlap": (3, lambda r: (shard_vocab(1000, min(r, 1), 3), 8), ["ranks 1 and 2 both hold vocabulary ids"]),
}


def _layout_worker(rank, world):
    import torch.distributed as dist

    groups = {2: dist.new_group([0, 1]), 3: dist.group.WORLD}
    out = {}
    for name, (tp, make, _) in LAYOUTS.items():
        if rank < tp:
            shard, hsize = make(rank)
            out[name] = timed(lambda: localargmax.check_layouts(shard, hsize, groups[tp]))
    full = torch.randn(1000, 8)
    for tp in (2, 3):  # the module checks at construction: rank > 0 believes in one more rank
        if rank < tp:
            ws = tp if rank == 0 else tp + 1
            out[("module", tp)] = timed(
                lambda: localargmax.VocabParallelLMHead.from_full(full, rank, ws, group=groups[tp]) and None
            )
    return out


def test_inconsistent_layouts_refused_on_every_rank():
    per_rank = run_ranks(_layout_worker, 3, timeout=180)
    for name, (tp, _, words) in LAYOUTS.items():
        for r in range(tp):
            res = per_rank[r][name]
            if words is None:
                assert res["ok"], f"{name} rank {r}: {res}"
                continue
            assert not res["ok"] and res["type"] == "ValueError" and res["elapsed"] < 30, f"{name} rank {r}: {res}"
            for w in words:
                assert w in res["error"], f"{name} rank {r}: {w!r} not in {res['error']!r}"
    for tp in (2, 3):
        for r in range(tp):
            res = per_rank[r][("module", tp)]
            assert not res["ok"] and res["type"] == "ValueError", res
            assert "inconsistent vocab-parallel layouts" in res["error"] and "rows differs across ranks" in res["error"]
