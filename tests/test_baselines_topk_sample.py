"""The top-k and sampling baselines (localargmax.baselines.full_gather_topk,
full_gather_sample): torch.topk / torch.multinomial on the all-gathered logits,
in one process and across gloo ranks. Padding never comes back; ranks whose
generators share a seed draw the same sample."""
from __future__ import annotations

import pytest
import torch

from helpers import run_ranks
from localargmax import build_d2t, shard_vocab
from localargmax.baselines import full_gather_argmax, full_gather_sample, full_gather_topk

VOCAB, HSIZE, BATCH = 333, 11, 5


def distinct_problem(gen):
    """Small-integer hidden/weight plus a bias of distinct multiples of 100:
    every logit is an exact float32 integer and all logits of a row differ, so
    the top-k order is unique and exact."""
    weight = torch.randint(-3, 4, (VOCAB, HSIZE), generator=gen).float()
    hidden = torch.randint(-3, 4, (BATCH, HSIZE), generator=gen).float()
    bias = torch.randperm(VOCAB, generator=gen).float() * 100
    return hidden, weight, bias


def padded_shard(weight, bias, rank, tp, fill=1e4):
    """Standard-layout shard whose padding rows would win if they were read."""
    start, rows, valid = shard_vocab(weight.shape[0], rank, tp, 64)
    w = torch.full((rows, weight.shape[1]), fill)
    w[:valid] = weight[start:start + valid]
    b = torch.full((rows,), fill)
    b[:valid] = bias[start:start + valid]
    return w, b, start, valid


def test_topk_single_rank_matches_torch_topk(gen):
    hidden, weight, bias = distinct_problem(gen)
    w, b, start, valid = padded_shard(weight, bias, 0, 1)
    d2t = build_d2t(torch.randint(0, 1000, (3000,), generator=gen), VOCAB)
    want = (hidden @ weight.T + bias).topk(7, dim=1)
    ids, values = full_gather_topk(hidden, w, 7, num_valid=valid, bias=b)
    assert torch.equal(ids, want.indices) and torch.equal(values, want.values)
    ids_t, _ = full_gather_topk(hidden, w, 7, num_valid=valid, bias=b, d2t=d2t)
    assert torch.equal(ids_t, want.indices + d2t[want.indices])
    bf16, _ = full_gather_topk(hidden.bfloat16(), w.bfloat16(), 3, num_valid=valid)
    assert bf16.dtype == torch.int64 and bf16.shape == (BATCH, 3) and bool((bf16 < VOCAB).all())


def test_sample_single_rank(gen):
    hidden, weight, bias = distinct_problem(gen)
    w, b, _, valid = padded_shard(weight, bias * 0.01, 0, 1)
    # T = 0 is greedy
    assert torch.equal(full_gather_sample(hidden, w, temperature=0, num_valid=valid, bias=b),
                       full_gather_argmax(hidden, w, num_valid=valid, bias=b))
    # the same seed gives the same draw; padding is never drawn
    draws = [full_gather_sample(hidden, w, temperature=2.0, num_valid=valid, bias=b,
                                generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(draws[0], draws[1]) and bool((draws[0] < VOCAB).all())
    # the distribution is softmax(logits / T): one row, many draws
    h = (torch.randn(1, HSIZE, generator=gen) * 0.3).expand(40000, HSIZE).contiguous()
    wr = torch.randn(VOCAB, HSIZE, generator=gen)
    probs = torch.softmax((h[0] @ wr.T) / 1.5, dim=0)
    got = full_gather_sample(h, wr, temperature=1.5, generator=gen)
    freq = torch.bincount(got, minlength=VOCAB).double() / got.numel()
    assert float((freq - probs.double()).abs().max()) < 0.01


def test_bad_arguments():
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


def _worker(rank, world_size, seed):
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(seed)
    hidden, weight, bias = distinct_problem(gen)
    w, b, start, valid = padded_shard(weight, bias, rank, world_size)
    g = dist.group.WORLD
    ids, values = full_gather_topk(hidden, w, 9, vocab_start=start, num_valid=valid, bias=b, group=g)
    sampled = full_gather_sample(hidden, w, temperature=30.0, vocab_start=start, num_valid=valid, bias=b / 100,
                                 group=g, generator=torch.Generator().manual_seed(seed))
    return ids.tolist(), values.tolist(), sampled.tolist()


def test_on_gloo_ranks(seed):
    hidden, weight, bias = distinct_problem(torch.Generator().manual_seed(seed))
    want = (hidden @ weight.T + bias).topk(9, dim=1)
    results = run_ranks(_worker, 3, seed)
    for ids, values, sampled in results:
        assert ids == want.indices.tolist() and values == want.values.tolist()
        assert sampled == results[0][2]  # every rank draws the same ids from the same seed
        assert max(sampled) < VOCAB  # padding (which would win with any weight) is never drawn
