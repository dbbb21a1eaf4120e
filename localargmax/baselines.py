"""What engines do today, for the benchmark to compare against.

Both baselines assume the standard contiguous layout of
:func:`localargmax.shard_vocab`: rank ``r`` of ``tp`` holds global rows
``[r * rows, (r + 1) * rows)``, padding at the end of the vocabulary.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

FLOAT32_EXACT_INDEX_LIMIT = 2**24
"""float32 holds every integer below 2**24 exactly, and not all above it."""


def _rank_and_size(group: Optional[dist.ProcessGroup]):
    if group is None:
        return 0, 1
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"baselines take a torch.distributed.ProcessGroup or None as group, got {type(group).__name__}")
    return dist.get_rank(group), dist.get_world_size(group)


def _local_logits(hidden, weight, num_valid, bias):
    """``[B, rows]`` logits in the weight dtype, padding rows set to -inf."""
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden dtype ({hidden.dtype}) must equal weight dtype ({weight.dtype})")
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    if num_valid < weight.shape[0]:
        logits[:, num_valid:] = float("-inf")
    return logits


def _check_standard_layout(vocab_start, rows, rank):
    if vocab_start != rank * rows:
        raise ValueError(
            f"baselines assume the shard_vocab layout (vocab_start = rank * rows = {rank * rows}), got vocab_start={vocab_start}"
        )


def full_gather_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    """Today's path: local logits ``[B, rows]`` by torch matmul (in the weight
    dtype), all-gather of the logits to ``[B, tp * rows]`` on every rank,
    ``argmax``, then ``k + d2t[k]``. Sends ``B * rows * itemsize`` bytes per rank.

    Padding logits are set to -inf before the gather; with padding at the end of
    the vocabulary (the :func:`~localargmax.shard_vocab` layout) a padding entry
    can then never be returned, even for an all -inf row. Note the argmax runs on
    logits rounded to the weight dtype (bf16 logits can tie where float32 ones
    do not): the benchmark's ``agree`` column measures this.

    Returns ``[B]`` int64 ids. Raises ValueError for a non-standard layout.
    """
    rank, tp = _rank_and_size(group)
    rows = weight.shape[0]
    num_valid = rows if num_valid is None else num_valid
    _check_standard_layout(vocab_start, rows, rank)
    logits = _local_logits(hidden, weight, num_valid, bias)
    batch = logits.shape[0]
    if tp > 1:
        gathered = funcol.wait_tensor(funcol.all_gather_single(logits.contiguous(), 0, group))  # [tp * B, rows]
        logits = gathered.view(tp, batch, rows).permute(1, 0, 2).reshape(batch, tp * rows)
    ids = logits.argmax(dim=1)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids


def unfused_local_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    """The unfused local-argmax path engines ship now: torch matmul, ``max``
    over the shard, all-gather of ``(value, global index)`` as float32 pairs
    (8 bytes per row per rank), pick the best rank (first rank on ties, i.e.
    smallest index), then ``k + d2t[k]``.

    The logits are materialized (in the weight dtype) and the index travels as
    a float32, which is exact only below 2**24.

    Returns ``[B]`` int64 ids.

    Raises:
        ValueError if the padded vocabulary (``tp * rows``) reaches 2**24: the
        float32 index would be silently wrong, so this baseline refuses (the
        decision uses only values every rank shares, so no rank is left waiting);
        ValueError for a non-standard layout.
    """
    rank, tp = _rank_and_size(group)
    rows = weight.shape[0]
    num_valid = rows if num_valid is None else num_valid
    _check_standard_layout(vocab_start, rows, rank)
    if tp * rows > FLOAT32_EXACT_INDEX_LIMIT:
        raise ValueError(
            f"unfused_local_argmax carries indices as float32, exact only below 2**24; the padded vocabulary "
            f"tp * rows = {tp * rows} is larger (use localargmax.lm_head_argmax, which packs exact 32-bit indices)"
        )
    logits = _local_logits(hidden, weight, num_valid, bias)
    values, local_ids = logits.float().max(dim=1)
    pairs = torch.stack([values, (local_ids + vocab_start).float()], dim=1)  # [B, 2] float32
    batch = pairs.shape[0]
    if tp > 1:
        pairs = funcol.wait_tensor(funcol.all_gather_single(pairs.contiguous(), 0, group)).view(tp, batch, 2)
    else:
        pairs = pairs.unsqueeze(0)
    best_rank = pairs[:, :, 0].argmax(dim=0)  # first rank wins ties; NaN wins
    ids = pairs[best_rank, torch.arange(batch, device=pairs.device), 1].to(torch.int64)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids
