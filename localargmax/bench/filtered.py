"""Filtered sampling in the benchmark (``--op sample --top-k/--top-p/--min-p``;
DESIGN.md, "Filtered sampling"): the baseline that gathers the logits and
filters them as vLLM does, the share of rows whose allowed set the merged
candidates do not decide (the fallback), and the bytes of each side.

bench/filtered_sampling.py (a checkout's sweep over common SamplingParams)
and the CLI both use these."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import sampling, shard_topk, shard_vocab
from ..baselines import gathered_logits, shard_logits
from ..collective import all_gather_single, payload_length

SETTINGS = [  # (T, top_k, top_p, min_p): common vLLM SamplingParams
    (0.7, 0, 0.9, 0.0), (1.0, 0, 0.9, 0.0), (0.7, 0, 0.95, 0.0), (1.0, 0, 0.95, 0.0),
    (1.0, 20, 1.0, 0.0), (1.0, 50, 1.0, 0.0), (0.7, 50, 0.95, 0.0), (1.0, 0, 1.0, 0.05),
    (0.7, 20, 0.8, 0.05),
]  # fmt: skip
"""The settings bench/filtered_sampling.py sweeps."""


def vllm_filter(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """vLLM's filters on full rows, written as its PyTorch sampler does:
    ``y = logits.float() / T``; min-p masks ``y < max(y) + log(min_p)``;
    top-k / top-p by one ascending sort (``apply_top_k_top_p_pytorch``'s
    method: top-k masks values below the k-th largest, top-p masks the
    prefix whose cumulative softmax is ``<= 1 - p``, never the largest).
    Off: ``top_k <= 0``, ``top_p >= 1``, ``min_p <= 0``.

    Args:
        logits: ``[B, V]`` logits (any float dtype, any device; -inf = never).
        temperature: ``T > 0``.

    Returns:
        ``[B, V]`` float32 tempered logits, -inf where filtered out.
    """
    y = logits.float() / temperature
    if min_p > 0:
        y = y.masked_fill(y < y.max(dim=1, keepdim=True).values + math.log(min_p), -math.inf)
    k_on = 0 < top_k < y.shape[1]
    if k_on or top_p < 1:
        ys, idx = y.sort(dim=1)
        if k_on:
            ys = ys.masked_fill(ys < ys[:, -top_k : ys.shape[1] - top_k + 1], -math.inf)
        if top_p < 1:
            mask = ys.softmax(dim=1).cumsum(dim=1) <= 1 - top_p
            mask[:, -1] = False
            ys = ys.masked_fill(mask, -math.inf)
        y = y.scatter(1, idx, ys)
    return y


def vllm_race(logits, temperature, top_k, top_p, min_p, generator=None) -> torch.Tensor:
    """vLLM's sample of full-vocabulary logits ``[n, V]``: :func:`vllm_filter`, then the
    exponential race ``argmax(probs / q)``, ``q ~ Exp(1)`` from ``generator``; temperature 0:
    the argmax. ``[n]`` int64 ids."""
    if temperature == 0:
        return logits.argmax(dim=1)
    y = vllm_filter(logits, temperature, top_k, top_p, min_p)
    q = torch.empty_like(y).exponential_(generator=generator)
    return (y.softmax(dim=1) / q).argmax(dim=1)


def gather_filter_sample(
    hidden, weight, *, temperature, top_k, top_p, min_p, seed, offset=0, vocab_start=0, num_valid=None,
    d2t=None, group=None, generator=None, noise="exponential",
):  # fmt: skip
    """The full-gather baseline of filtered sampling: the ``[B, tp * rows]``
    logits all-gathered (:func:`localargmax.baselines.full_gather_sample`'s
    gather), :func:`vllm_filter`, then a sample, then ``id + d2t[id]``.

    ``noise="exponential"``: vLLM's sampler, ``argmax(probs / q)`` with
    ``q ~ Exp(1)`` from ``generator`` (what the bench times).
    ``noise="gumbel"``: ``argmax(y + g)`` with the fused kernels' noise
    :func:`localargmax.sampling.gumbel_noise` keyed by ``(seed, offset + b,
    global id)``, so the ids equal ``lm_head_sample``'s away from float32
    near-ties (what the bench's ``agree`` compares). Temperature 0: argmax.

    Returns:
        ``[B]`` int64 ids (target ids with ``d2t``).
    """
    if noise not in ("exponential", "gumbel"):
        raise ValueError(f"noise must be 'exponential' or 'gumbel', got {noise!r}")
    logits = gathered_logits(hidden, weight, vocab_start, num_valid, None, group)
    if noise == "gumbel" and temperature != 0:
        y = vllm_filter(logits, temperature, top_k, top_p, min_p)
        rows = offset + torch.arange(y.shape[0], device=y.device)[:, None]
        g = sampling.gumbel_noise(seed, rows, torch.arange(y.shape[1], device=y.device)[None])
        ids = (y + g).argmax(dim=1)
    else:
        ids = vllm_race(logits, temperature, top_k, top_p, min_p, generator)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids


def needs_fallback(
    keys_by_rank, pairs_by_rank, temperature, top_k, top_p, min_p, seed, offset=0, vocab_total=None
) -> torch.Tensor:
    """``[B]`` bool: the rows whose allowed set the merged candidates of the
    ranks do not decide (``lm_head_sample`` recomputes them from gathered
    logits), from each rank's ``shard_topk(..., CANDIDATES,
    log_partition=True)`` output (``[tp, B, K]`` keys, ``[tp, B, 2]`` pairs);
    ``vocab_total`` (or an upper bound) for top-p at ``T > 1``."""
    tp, b, _ = keys_by_rank.shape
    dev = keys_by_rank.device
    full = lambda v, dt: torch.full((b,), v, dtype=dt, device=dev)  # noqa: E731
    p, mp = full(top_p, torch.float32).double(), full(min_p, torch.float32).double()  # as lm_head_sample rounds them
    rows = offset + torch.arange(b, device=dev)
    t, k = full(temperature, torch.float32), full(top_k, torch.int64)
    _, _, need = sampling.decide_rows(keys_by_rank, pairs_by_rank, t, k, p, mp, seed, rows, vocab_total)
    return need


def _candidates(hidden, weight, vocab_start, num_valid):
    return shard_topk(
        hidden, weight, sampling.CANDIDATES, vocab_start=vocab_start, num_valid=num_valid, log_partition=True
    )


def fallback_rows_dist(hidden, weight, layout, group, temperature, top_k, top_p, min_p, seed, offset=0):
    """:func:`needs_fallback` of a running TP group: every rank's candidates of
    its own shard, all-gathered (a collective: every rank calls it)."""
    keys, pairs = _candidates(hidden, weight, layout.vocab_start, layout.num_valid)
    tp = dist.get_world_size(group)
    got_k = [torch.empty_like(keys) for _ in range(tp)]
    got_p = [torch.empty_like(pairs) for _ in range(tp)]
    dist.all_gather(got_k, keys.contiguous(), group=group)
    dist.all_gather(got_p, pairs.contiguous(), group=group)
    got_k, got_p = torch.stack(got_k), torch.stack(got_p)
    return needs_fallback(got_k, got_p, temperature, top_k, top_p, min_p, seed, offset, tp * layout.rows)


def fallback_share(hidden, weight, tp, temperature, top_k, top_p, min_p, seed=1) -> float:
    """Share of rows the merged candidates of ``tp`` shards of the full
    ``weight`` (``shard_vocab``, simulated in one process) do not decide."""
    keys, pairs = [], []
    for r in range(tp):
        s = shard_vocab(weight.shape[0], r, tp)
        kk, pp = _candidates(
            hidden, weight[s.vocab_start : s.vocab_start + s.num_valid].contiguous(), s.vocab_start, None
        )
        keys.append(kk)
        pairs.append(pp)
    keys, pairs = torch.stack(keys), torch.stack(pairs)
    need = needs_fallback(keys, pairs, temperature, top_k, top_p, min_p, seed, 0, weight.shape[0])
    return float(need.float().mean())


def filtered_bytes(batch: int, n_fallback: int, shard_rows: int) -> int:
    """Bytes one rank sends in a filtered ``lm_head_sample`` step: the
    candidates' exchange, ``8 * payload_length(batch, CANDIDATES + 1, True)``,
    plus the fallback gather of ``n_fallback`` rows (none: nothing)."""
    fb = 8 * sampling.fallback_payload_length(n_fallback, shard_rows) if n_fallback else 0
    return 8 * payload_length(batch, sampling.CANDIDATES + 1, True) + fb


def owned_rows(batch: int, tp: int, rank: int) -> int:
    """Rows of a ``batch`` that TP rank ``rank`` owns in vLLM 0.34's batch-sharded sampling
    (``batch_shard.shard_owners``: row ``b`` to rank ``b % tp``)."""
    return len(range(rank, batch, tp))


def batch_sharded_bytes(batch: int, rows: int, itemsize: int, tp: int, rank: int = 0) -> tuple[int, int]:
    """``(sent, received)`` bytes of TP rank ``rank`` in one step of vLLM 0.34's batch-sharded
    sampling (``enable_batch_sharded_sampling``; v1/worker/gpu/sample/batch_shard.py's plan), as
    :func:`batch_sharded_sample` runs it: the all-to-all sends each other rank the ``[B_r, rows]``
    local logits of the rows it owns (``B_r`` = :func:`owned_rows`), in the logits' dtype
    (``itemsize``); then the sampled ids, int64, padded to ``ceil(B / tp)`` per rank, are
    all-gathered (vLLM's ``gather_sampler_output`` also gathers the counts and, when asked, the
    log-probs: not counted)."""
    own = owned_rows(batch, tp, rank)
    per_rank_ids = 8 * -(-batch // tp) if tp > 1 else 0
    sent = (batch - own) * rows * itemsize + per_rank_ids
    received = (tp - 1) * own * rows * itemsize + (tp - 1) * per_rank_ids
    return sent, received


def batch_sharded_sample(
    hidden, weight, *, temperature, top_k=0, top_p=1.0, min_p=0.0, generator=None, vocab_start=0,
    num_valid=None, d2t=None, group=None,
):  # fmt: skip
    """vLLM 0.34's batch-sharded sampling, the baseline: local logits ``[B, rows]`` in the
    weight dtype (padding -inf); an all-to-all gives TP rank ``r`` the full-vocab logits
    ``[B_r, tp * rows]`` of the rows it owns (row ``b`` to rank ``b % tp``); it applies
    :func:`vllm_filter` and vLLM's exponential race (``argmax(probs / q)``, ``q ~ Exp(1)`` from
    ``generator``; temperature 0: argmax) to them; the sampled ids are all-gathered back into
    batch order, then ``id + d2t[id]``. Bytes: :func:`batch_sharded_bytes`.

    Args:
        hidden, weight, vocab_start, num_valid, d2t, group: as in
            :func:`localargmax.baselines.full_gather_sample` (the ``shard_vocab`` layout).
        temperature: a float ``>= 0``; top_k, top_p, min_p: vLLM's filters (off: 0, 1, 0).
        generator: a ``torch.Generator`` on the logits' device, or None.

    Returns:
        ``[B]`` int64 ids (target ids with ``d2t``) on every rank.

    Raises:
        ValueError for a non-standard layout; TypeError as
        :func:`localargmax.baselines.full_gather_argmax`.
    """
    logits, rank, tp = shard_logits(hidden, weight, vocab_start, num_valid, None, group)
    batch, rows = logits.shape
    if tp > 1:
        order = torch.cat([torch.arange(r, batch, tp, device=logits.device) for r in range(tp)])
        splits = [owned_rows(batch, tp, r) for r in range(tp)]
        own = splits[rank]
        received = logits.new_empty((tp * own, rows))
        dist.all_to_all_single(
            received, logits[order].contiguous(), [own] * tp, splits, group=group
        )  # rank r's block of my rows, in rank order
        logits = received.view(tp, own, rows).permute(1, 0, 2).reshape(own, tp * rows)
    ids = vllm_race(logits, temperature, top_k, top_p, min_p, generator)
    if tp > 1:
        width = -(-batch // tp)
        padded = torch.cat([ids, ids.new_zeros(width - ids.shape[0])])
        gathered = all_gather_single(padded, group)
        b = torch.arange(batch, device=ids.device)
        ids = gathered.view(tp, width)[b % tp, b // tp]
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids
