"""d2t.py: EAGLE-3 draft-to-target tables (build_d2t, validate_d2t,
draft_to_target_ids) and d2t through the step."""

from __future__ import annotations

import pytest
import torch

import localargmax
from localargmax import build_d2t, draft_to_target_ids, validate_d2t
from tests.support.checks import raises_cleanly
from tests.support.problems import make_shards, simulated_argmax
from tests.support.reference import ref_argmax
from tests.support.strategies import d2t_for, exact_problems, given, settings, st


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
        assert ids.tolist() == sorted(sorted(range(target), key=lambda t: (-int(counts[t]), t))[:k])
        validate_d2t(d2t, k, target)


def test_validate_accepts_a_good_table():
    validate_d2t(torch.tensor([0, 1, 1, 5], dtype=torch.int64), 4, 9)  # targets 0, 2, 3, 8


def test_d2t_end_to_end_through_lm_head_argmax(gen):
    """A draft lm_head whose ids are mapped to target ids by a build_d2t table."""
    d2t = build_d2t(torch.randint(0, 1000, (5000,), generator=gen), 700)
    hidden, weight = torch.randn(10, 48, generator=gen), torch.randn(700, 48, generator=gen)
    draft_ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight))[0]
    ids = localargmax.lm_head_argmax(hidden, weight, d2t=d2t)
    assert torch.equal(ids, draft_ids + d2t[draft_ids])
    assert set(ids.tolist()) <= set(draft_to_target_ids(d2t).tolist())


@settings(max_examples=500, deadline=None)
@given(p=exact_problems(min_batch=1), tp=st.integers(1, 4), d2t_seed=st.integers(0, 2**16))
def test_d2t_maps_exactly(p, tp, d2t_seed):
    """Exact data, world size 1 and simulated ranks: ids are the reference's draft id k mapped to k + d2t[k]."""
    d2t = d2t_for(d2t_seed, p.weight.shape[0])
    target = draft_to_target_ids(d2t)
    assert bool((target[1:] > target[:-1]).all())
    want = ref_argmax(p.hidden, p.weight, p.bias, d2t)
    assert torch.equal(localargmax.lm_head_argmax(p.hidden, p.weight, bias=p.bias, d2t=d2t), want), p
    assert torch.equal(
        simulated_argmax(p.hidden, make_shards(p.weight, p.bias, tp, 64, hidden=p.hidden), d2t=d2t), want
    ), p


GOOD = torch.tensor([0, 1, 1, 5], dtype=torch.int64)  # draft 4 -> targets 0, 2, 3, 8
BAD_VALIDATE = {
    "list": (([0, 0], 2, 5), TypeError, "d2t"),
    "int32": ((torch.zeros(2, dtype=torch.int32), 2, 5), TypeError, "d2t must be int64"),
    "float": ((torch.zeros(2), 2, 5), TypeError, "d2t must be int64"),
    "2d": ((torch.zeros(2, 1, dtype=torch.int64), 2, 5), ValueError, "d2t must be 1-D"),
    "wrong_length": ((torch.zeros(3, dtype=torch.int64), 2, 5), ValueError, "draft_vocab_size=2"),
    "wrong_length_longer": ((GOOD, 5, 9), ValueError, "draft_vocab_size=5"),
    "negative_target": ((torch.tensor([0, -2]), 2, 5), ValueError, "draft id 1"),
    "negative_target_first": ((torch.tensor([-1, 0, 0, 0]), 4, 9), ValueError, "draft id 0 to target id -1"),
    "target_too_big": ((torch.tensor([5, 0]), 2, 5), ValueError, "draft id 0"),
    "target_past_vocab": ((GOOD, 4, 8), ValueError, "draft id 3 to target id 8"),
    "empty_target_vocab": ((torch.zeros(1, dtype=torch.int64), 1, 0), ValueError, "target_vocab_size"),
}


@pytest.mark.parametrize("case", list(BAD_VALIDATE))
def test_validate_d2t_rejects(case):
    args, exc, match = BAD_VALIDATE[case]
    raises_cleanly(exc, match, validate_d2t, *args)


BAD_BUILD = {
    "counts_2d": ((torch.ones(3, 2), 1), "token_counts"),
    "counts_list": (([1, 2, 3], 1), "token_counts"),
    "counts_empty": ((torch.ones(0), 1), "draft_vocab_size"),
    "counts_nan": ((torch.tensor([1.0, float("nan"), 3.0]), 2), "token_counts"),
    "k_zero": ((torch.ones(3), 0), "draft_vocab_size"),
    "k_too_big": ((torch.ones(3), 4), "draft_vocab_size"),
    "k_bool": ((torch.ones(3), True), "draft_vocab_size"),
    "k_float": ((torch.ones(3), 2.0), "draft_vocab_size"),
}


@pytest.mark.parametrize("case", list(BAD_BUILD))
def test_build_d2t_rejects(case):
    args, match = BAD_BUILD[case]
    raises_cleanly(ValueError, match, build_d2t, *args)
