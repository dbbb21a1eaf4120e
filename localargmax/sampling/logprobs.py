"""Log-probabilities, one implementation for every step (DESIGN.md,
"Log-probabilities"): the ranks' log-partition pairs merged
(:func:`log_probs_from_pairs`, the op's merge; :func:`log_odds_from_pairs`),
and, for steps that hold logits (the filtered fallback, vLLM's target
sampler), a shard's partition (:func:`shard_partition`), the ranks'
partitions merged (:func:`merge_partitions`) and the one log-sum-exp that
turns a partition into log-probabilities (:func:`log_prob_of`)."""

from __future__ import annotations

import math

import torch

from ..engine import winning_rank


def shard_partition(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One shard's partition per row: ``(m, s)`` with ``m = max(x)`` and ``s
    = Σ exp(x - m)`` over the last dimension, in float64 (``x`` any float
    dtype, ``[B, n]``, ``n >= 1``). An all ``-inf`` row gives ``(-inf, 0)``
    (it adds nothing); a NaN or ``+inf`` propagates NaN into ``s`` as in
    ``torch.log_softmax``."""
    xd = x.to(torch.float64)
    m = xd.max(dim=-1).values
    return m, torch.exp(xd - torch.where(m == -math.inf, 0.0, m).unsqueeze(-1)).sum(dim=-1)


def merge_partitions(m: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ranks' partitions ``[tp, B]`` (rank-major, float64) merged: ``(M,
    S)`` with ``M = max_r m_r`` and ``S = Σ_r s_r · exp(m_r - M)`` (every rank
    all ``-inf``: ``S = 0``)."""
    top = m.max(dim=0).values
    return top, (s * torch.exp(m - torch.where(top == -math.inf, 0.0, top))).sum(dim=0)


def log_prob_of(values: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of ``values`` under a partition ``(m, s)`` (``s = Σ
    exp(x - m)`` over the distribution's support): ``(values - m) - log(s)``,
    vLLM's order of operations (a tie at ``|m| ~ 3e38`` keeps its ``log 2``).
    ``m`` and ``s`` broadcast against ``values``; ``s = 0``: ``-inf`` / NaN,
    as ``torch.log_softmax`` of an empty or all ``-inf`` row."""
    return (values - m) - torch.log(s)


def log_probs_from_pairs(
    values: torch.Tensor, pairs: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities of transformed logits ``values`` from every rank's
    log-partition pair (DESIGN.md, "Log-probabilities"): with
    ``A = max_r ref_r`` and ``S = sum_r (others_r + [ref_r > -inf]) * exp((ref_r - A) / T)``
    (ranks in order 0, 1, ..., float32; a rank whose ``ref`` equals ``A``
    counts with factor 1, so ``+inf`` and all ``-inf`` rows stay exact), the
    result is ``(value - A) / T - log(S)``, i.e. ``value / T - logsumexp(x / T)``
    over the ranks' full unpadded vocabulary.

    Example::

        keys, pairs = shard_argmax(hidden, weight, log_partition=True)
        _, values = decode_keys(keys)
        log_probs = log_probs_from_pairs(values, pairs[None])  # one rank: [1, B, 2]

    Args:
        values: ``[B]`` or ``[B, k]`` float32 transformed logits.
        pairs: ``[tp, B, 2]`` float32 ``(ref, others)`` pairs, rank-major.
        temperature: optional ``[B]`` float32; rows with ``T > 0`` use ``T``,
            rows with ``T == 0`` (greedy) and ``None`` use 1.

    Returns:
        float32 log-probabilities, the shape of ``values``, on its device:
        NaN for a row with a NaN logit anywhere (as ``torch.log_softmax``),
        NaN for a ``+inf`` value and ``-inf`` beside one, NaN for an all
        ``-inf`` row. The same bits as the planned step's merge (one
        implementation, ``localargmax::log_probs_from_pairs``, C++ / CUDA).

    Raises:
        TypeError: ``values``, ``pairs`` or ``temperature`` not float32.
        ValueError: ``pairs`` not ``[tp >= 1, B, 2]``, ``temperature`` not
            ``[B]``, or a tensor on another device than ``values``.
    """
    return torch.ops.localargmax.log_probs_from_pairs.default(values, pairs, temperature)


def log_odds_from_pairs(keys: torch.Tensor, pairs: torch.Tensor, temperature: torch.Tensor | None = None):
    """The argmax's log-odds from every rank's keys and log-partition pairs
    (DESIGN.md, "Log-odds"): ``-log Σ_{z ≠ argmax} exp((x_z - x_max) / T)``
    over the ranks' full unpadded vocabulary, with the winning rank ``w``
    (the largest key) adding its ``others`` and every other rank ``r`` its
    ``others_r + 1`` (0 for an empty or all ``-inf`` shard) times
    ``exp((ref_r - ref_w) / T)`` (1 when equal), in rank order, float32. No
    ``total - 1``: a confident row keeps its digits.

    Example::

        keys, pairs = shard_argmax(hidden, weight, log_partition=True, temperature=t)
        log_odds = log_odds_from_pairs(keys[None], pairs[None], t)  # one rank

    Args:
        keys: ``[tp, B]`` int64 packed keys (each rank's argmax), rank-major.
        pairs: ``[tp, B, 2]`` float32 ``(ref, others)`` pairs computed at ``temperature``.
        temperature: optional ``[B]`` float32 (rows with ``T <= 0``, and
            ``None``, use 1); the one the pairs were computed at.

    Returns:
        ``[B]`` float32: ``<= 0`` where the maximum is tied, ``+inf`` where
        every other entry is ``-inf`` (or the vocabulary has one id), NaN for
        a row whose maximum is NaN, ``+inf`` or ``-inf`` (a NaN logit
        anywhere, an all ``-inf`` row).
    """
    ref, others = pairs[..., 0], pairs[..., 1]
    winner = winning_rank(keys)  # the argmax's rank
    top = ref.gather(0, winner)[0]
    t = None if temperature is None else torch.where(temperature > 0, temperature, 1.0)
    total = torch.zeros_like(top)
    ranks = torch.arange(pairs.shape[0], device=keys.device)
    for r in range(pairs.shape[0]):  # a fixed order: the same bits on every rank
        d = ref[r] - top if t is None else (ref[r] - top) / t
        own = others[r] + ((ref[r] > -math.inf) & (ranks[r] != winner[0])).to(others.dtype)
        total = total + own * torch.where(ref[r] == top, 1.0, torch.exp(d))
    return torch.where(top.isfinite(), -torch.log(total), math.nan)
