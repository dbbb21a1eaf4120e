"""The whole local-argmax step of a vocab-parallel lm_head: fused local
kernel, one collective, merge, d2t."""
from __future__ import annotations

from typing import Optional

import torch

from .collective import Group, check_step_consistency, debug_enabled, exchange_keys
from .ops import merge_keys, shard_argmax


def lm_head_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    group: Group = None,
    reduce: str = "all_gather",
) -> torch.Tensor:
    """Greedy token ids of a vocab-parallel lm_head, without gathering logits.

    Every TP rank calls this with its own shard. Each rank reduces its shard
    to one packed key per row (:func:`localargmax.shard_argmax`), the ranks
    exchange ``tp`` keys per row (8 bytes each) instead of ``rows`` logits, and
    every rank merges them to the same ids (:func:`localargmax.merge_keys`).

    Args:
        hidden: ``[B, H]`` hidden states (float32 / bfloat16 / float16), the same
            on every rank.
        weight: ``[rows, H]`` this rank's lm_head shard, rows contiguous.
        vocab_start, num_valid: this rank's layout (see
            :func:`localargmax.shard_vocab`); ``num_valid`` defaults to ``rows``.
        bias: optional ``[rows]`` bias shard.
        d2t: optional ``[draft_vocab]`` int64 EAGLE-3 offset table; ids are
            then target ids ``k + d2t[k]``. Validate it once at load time with
            :func:`localargmax.validate_d2t`; it is not re-checked per step.
        group: ``None`` (world size 1), a ``torch.distributed.ProcessGroup``
            (NCCL for CUDA tensors, gloo for CPU tensors), or a callable
            ``all_gather(keys [B]) -> [tp, B]``.
        reduce: ``"all_gather"`` or ``"all_reduce"`` (MAX on keys); identical ids.

    Returns:
        ``[B]`` int64 ids, identical on every rank, equal to ``torch.argmax``
        of the full unpadded logits (ties to the smallest index, NaN wins).

    Raises:
        TypeError / ValueError naming the argument for malformed inputs (see
        :func:`localargmax.shard_argmax`, :func:`localargmax.exchange_keys`).
        With ``LOCALARGMAX_DEBUG=1`` every step first all-gathers the batch
        size, hidden size, shard rows and d2t length and raises ValueError on
        every rank if they differ. A rank that never arrives surfaces as the
        group's own timeout (``init_process_group(timeout=...)``).
    """
    if debug_enabled():
        check_step_consistency(
            group,
            [hidden.shape[0] if hidden.dim() else -1, hidden.shape[-1] if hidden.dim() else -1,
             weight.shape[0] if weight.dim() else -1, 0 if d2t is None else d2t.shape[0]],
            ["batch size", "hidden size", "shard rows", "d2t length"],
        )
    keys = shard_argmax(hidden, weight, vocab_start=vocab_start, num_valid=num_valid, bias=bias)
    gathered = exchange_keys(keys, group, reduce)
    ids, _ = merge_keys(gathered, d2t)
    return ids
