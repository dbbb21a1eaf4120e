"""The target sampler's log-probabilities at extreme logits (issue #67 item 1):
``target_sampler.shard_logprobs`` on TP 1-4 (ranks simulated by threads that
meet in a callable all-gather; one rank may hold no id) against vLLM's
formula ``(x - max) - log Σ exp(x - max)`` in float64 on the gathered row.
The kinds: one shard row all ``-inf`` (the others finite), every shard all
``-inf`` (NaN, as ``torch.log_softmax``), ``-inf`` inside the top-n of a
short shard (a real id, never a padding slot), fp16 ±65504, ties at ±3e38
(``-log 2`` each), a NaN (NaN everywhere)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

pytest.importorskip("vllm.v1.outputs", reason="vLLM is not installed: the target sampler returns its LogprobsTensors")

from localargmax.integrations.vllm.target_sampler import shard_logprobs  # noqa: E402


class ThreadRanks:
    """``tp`` ranks as threads: ``group`` is a callable all-gather each rank calls with its ``[L]`` payload."""

    def __init__(self, tp: int):
        self.tp, self.barrier, self.slots = tp, threading.Barrier(tp), [None] * tp
        self.local = threading.local()

    def group(self, payload: torch.Tensor) -> torch.Tensor:
        self.slots[self.local.rank] = payload.clone()
        self.barrier.wait()
        out = torch.stack(self.slots)
        self.barrier.wait()  # every rank has read the slots before the next exchange writes them
        return out

    def run(self, fn):
        results, errors = [None] * self.tp, []

        def body(rank):
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001  reported below, on the test's thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        if errors:
            raise errors[0]
        return results


def _bounds(vocab: int, tp: int, empty_rank: bool):
    """Contiguous slices of ``[0, vocab)``; with ``empty_rank`` the last rank holds no id."""
    holders = tp - 1 if empty_rank and tp > 1 else tp
    cuts = [vocab * r // holders for r in range(holders + 1)]
    return [(cuts[r], cuts[r + 1]) for r in range(holders)] + [(vocab, vocab)] * (tp - holders)


def reference(x: torch.Tensor, sampled: torch.Tensor, n: int):
    """vLLM's compute_topk_scores in float64: ids ``[sampled, top n]`` (packed-key order) and ``(x - max) -
    log Σ exp(x - max)`` (every entry NaN when the row's max is NaN or -inf)."""
    xd = x.double()
    m = xd.max(dim=1, keepdim=True).values
    lp = (xd - m) - torch.log(torch.exp(xd - m).sum(dim=1, keepdim=True))
    order = torch.stack([torch.tensor(sorted(range(x.shape[1]), key=lambda i: _sort_key(float(row[i]), i)))
                         for row in x])  # fmt: skip
    ids = torch.cat([sampled[:, None], order[:, :n]], dim=1)
    return ids, lp.gather(1, ids)


def _sort_key(v: float, i: int):
    return (0 if math.isnan(v) else 1, -v if not math.isnan(v) else 0.0, i)


def _run(x, sampled, n, tp, empty_rank):
    ranks = ThreadRanks(tp)
    bounds = _bounds(x.shape[1], tp, empty_rank)
    outs = ranks.run(lambda r: shard_logprobs(x[:, bounds[r][0] : bounds[r][1]], bounds[r][0], sampled, n, ranks.group))
    for o in outs[1:]:
        assert torch.equal(o.logprob_token_ids, outs[0].logprob_token_ids)
        assert torch.equal(o.logprobs.isnan(), outs[0].logprobs.isnan())
    return outs[0]


def _cases(gen, dtype):
    big = 65504.0 if dtype == torch.float16 else 3e38
    x = torch.randn(7, 40, generator=gen, dtype=torch.float64).to(torch.float32) * 3
    x[0, :20] = -math.inf  # the first ranks' shard rows all -inf, the rest finite
    x[1, :] = -math.inf  # every shard all -inf
    x[2, 30:] = -math.inf  # -inf inside the top-n of the short shards
    x[2, :30] = -math.inf
    x[2, 5] = 1.0
    x[3, 3], x[3, 33] = big, big  # a tie at the largest finite magnitudes: -log 2 each
    x[4, 7], x[4, 27] = -big, -big
    x[4, 8] = big
    x[5, 11] = math.nan
    x[6, :] = torch.linspace(-big, big, 40)
    return x.to(dtype).to(torch.float32)


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("empty_rank", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("logits_mode", [False, True])
def test_shard_logprobs_at_extreme_logits(tp, empty_rank, dtype, logits_mode, gen):
    x = _cases(gen, dtype)
    sampled = torch.tensor([30, 4, 5, 3, 8, 11, 39])
    n = 6
    got = _run(x, sampled, n, tp, empty_rank) if not logits_mode else None
    if logits_mode:
        ranks = ThreadRanks(tp)
        b = _bounds(40, tp, empty_rank)
        got = ranks.run(lambda r: shard_logprobs(x[:, b[r][0] : b[r][1]], b[r][0], sampled, n, ranks.group,
                                                logits_mode=True))[0]  # fmt: skip
    ids, lp = reference(x, sampled, n)
    assert ((got.logprob_token_ids >= 0) & (got.logprob_token_ids < 40)).all(), got.logprob_token_ids
    assert torch.equal(got.logprob_token_ids, ids)
    want = x.double().gather(1, ids) if logits_mode else lp
    close = torch.isclose(got.logprobs.double(), want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert close.all(), (got.logprobs[~close.all(dim=1)], want[~close.all(dim=1)])
    if not logits_mode:
        assert got.logprobs[1].isnan().all() and got.logprobs[5].isnan().all()
        assert not got.logprobs[0].isnan().any() and not got.logprobs[2].isnan().any()
        assert torch.allclose(got.logprobs[3, :3].double(), torch.tensor([-math.log(2)] * 3, dtype=torch.float64))
