"""shard_vocab (the standard vocab-parallel layout) and the d2t helpers."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import localargmax
from localargmax import VocabShard, build_d2t, draft_to_target_ids, shard_vocab, validate_d2t


def _check_layout(vocab, tp, pad_to):
    shards = [shard_vocab(vocab, r, tp, pad_to) for r in range(tp)]
    assert all(isinstance(s, VocabShard) for s in shards)
    rows = shards[0].rows
    assert all(s.rows == rows for s in shards), "rows must be equal on every rank"
    # contiguous, disjoint, in rank order
    for r, s in enumerate(shards):
        assert s.vocab_start == r * rows
        assert 0 <= s.num_valid <= s.rows
    # the valid parts cover [0, V) exactly once
    covered = []
    for s in shards:
        covered.extend(range(s.vocab_start, s.vocab_start + s.num_valid))
    assert covered == list(range(vocab))
    # valid entries come first: a shard with padding is followed only by empty shards
    seen_partial = False
    for s in shards:
        if seen_partial:
            assert s.num_valid == 0
        if s.num_valid < s.rows:
            seen_partial = True
    total = rows * tp
    assert total >= vocab
    padded = -(-vocab // pad_to) * pad_to
    assert total >= padded
    if padded % tp == 0:
        assert total == padded and total % pad_to == 0
    else:
        assert total - padded < tp  # rows = ceil(padded / tp)
    return shards


@settings(max_examples=400, deadline=None)
@given(
    vocab=st.integers(1, 300_000),
    tp=st.integers(1, 16),
    pad_to=st.sampled_from([1, 2, 3, 7, 8, 64, 128, 256, 1000]),
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
    for rank in range(tp):
        s = shard_vocab(vocab, rank, tp)
        assert s.rows == padded // tp
        assert s.vocab_start == rank * (padded // tp)
        assert s.num_valid == max(0, min(padded // tp, vocab - rank * (padded // tp)))


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


def test_build_d2t_keeps_the_k_most_frequent_in_id_order(gen):
    for _ in range(20):
        target = int(torch.randint(1, 3000, (1,), generator=gen))
        k = int(torch.randint(1, target + 1, (1,), generator=gen))
        counts = torch.randint(0, 50, (target,), generator=gen)  # many equal counts
        d2t = build_d2t(counts, k)
        assert d2t.dtype == torch.int64 and d2t.shape == (k,)
        ids = torch.arange(k) + d2t
        assert torch.equal(draft_to_target_ids(d2t), ids)
        # independent model: sort by (-count, id), take k, sort by id
        order = sorted(range(target), key=lambda t: (-int(counts[t]), t))[:k]
        assert ids.tolist() == sorted(order)
        assert bool((ids[1:] > ids[:-1]).all())
        validate_d2t(d2t, k, target)


def test_build_d2t_rejects_bad_arguments():
    with pytest.raises(ValueError, match="token_counts"):
        build_d2t(torch.ones(3, 3), 2)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_d2t(torch.ones(5), 0)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_d2t(torch.ones(5), 6)


def test_validate_d2t_rejects_bad_tables():
    good = torch.tensor([0, 1, 1, 5], dtype=torch.int64)  # targets 0, 2, 3, 8
    validate_d2t(good, 4, 9)
    with pytest.raises(TypeError, match="int64"):
        validate_d2t(good.to(torch.int32), 4, 9)
    with pytest.raises(TypeError, match="d2t"):
        validate_d2t([0, 1, 1, 5], 4, 9)
    with pytest.raises(ValueError, match="draft_vocab_size=5"):
        validate_d2t(good, 5, 9)
    with pytest.raises(ValueError, match="1-D"):
        validate_d2t(good.view(2, 2), 4, 9)
    with pytest.raises(ValueError, match="draft id 3 to target id 8"):
        validate_d2t(good, 4, 8)
    with pytest.raises(ValueError, match="draft id 0 to target id -1"):
        validate_d2t(torch.tensor([-1, 0, 0, 0]), 4, 9)


def test_d2t_end_to_end_through_lm_head_argmax(gen):
    """A draft lm_head whose ids are mapped to target ids by a build_d2t table."""
    target_vocab, draft_vocab = 5000, 700
    counts = torch.randint(0, 1000, (target_vocab,), generator=gen)
    d2t = build_d2t(counts, draft_vocab)
    hidden = torch.randn(10, 48, generator=gen)
    weight = torch.randn(draft_vocab, 48, generator=gen)
    draft_ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight))[0]
    ids = localargmax.lm_head_argmax(hidden, weight, d2t=d2t)
    assert torch.equal(ids, draft_ids + d2t[draft_ids])
    assert set(ids.tolist()) <= set(draft_to_target_ids(d2t).tolist())
