"""What engines do today, for the benchmark to compare against: greedy
(:func:`full_gather_argmax`, :func:`unfused_local_argmax`), top-k
(:func:`full_gather_topk`) and sampling (:func:`full_gather_sample`).

All baselines assume the standard contiguous layout of
:func:`localargmax.shard_vocab`: rank ``r`` of ``tp`` holds global rows
``[r * rows, (r + 1) * rows)``, padding at the end of the vocabulary.
They share the steps' arguments, stated once here: ``hidden [B, H]``,
``weight [rows, H]``, keyword ``vocab_start``, ``num_valid`` (int or None),
``bias [rows]`` or None, ``d2t`` int64 ``[draft vocab]`` or None, ``group``
a ``torch.distributed`` ProcessGroup or None (the default group).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._validation import TEMPERATURE, check_row_number
from .collective import all_gather_single
from .engine import local_logits

FLOAT32_EXACT_INDEX_LIMIT = 2**24
"""float32 holds every integer below 2**24 exactly, and not all above it."""


def _rank_and_size(group: dist.ProcessGroup | None):
    if group is None:
        return 0, 1
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"baselines take a torch.distributed.ProcessGroup or None as group, got {type(group).__name__}")
    return dist.get_rank(group), dist.get_world_size(group)


def _check_standard_layout(vocab_start, rows, rank):
    if vocab_start != rank * rows:
        raise ValueError(
            "baselines assume the shard_vocab layout "
            f"(vocab_start = rank * rows = {rank * rows}), got vocab_start={vocab_start}"
        )


def shard_logits(hidden, weight, vocab_start, num_valid, bias, group):
    """This TP rank's ``[B, rows]`` logits as engines compute them: torch matmul
    in the weight dtype (the bias rounded to it), padding rows ``-inf``; with
    ``(rank, tp)`` of ``group``. Every baseline starts here.

    Raises:
        TypeError when hidden and weight dtypes differ or ``group`` is not a
        ProcessGroup; ValueError for a non-standard layout.
    """
    rank, tp = _rank_and_size(group)
    rows = weight.shape[0]
    _check_standard_layout(vocab_start, rows, rank)
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden dtype ({hidden.dtype}) must equal weight dtype ({weight.dtype})")
    num_valid = rows if num_valid is None else num_valid
    return local_logits(hidden, weight, None if bias is None else bias.to(weight.dtype), num_valid), rank, tp


def full_gather_argmax(hidden, weight, *, vocab_start=0, num_valid=None, bias=None, d2t=None, group=None):
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
    ids = gathered_logits(hidden, weight, vocab_start, num_valid, bias, group).argmax(dim=1)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids


def unfused_local_argmax(hidden, weight, *, vocab_start=0, num_valid=None, bias=None, d2t=None, group=None):
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
    _check_standard_layout(vocab_start, rows, rank)
    if tp * rows > FLOAT32_EXACT_INDEX_LIMIT:
        raise ValueError(
            f"unfused_local_argmax carries indices as float32, exact only below 2**24; the padded vocabulary "
            f"tp * rows = {tp * rows} is larger (use localargmax.lm_head_argmax, which packs exact 32-bit indices)"
        )
    logits, _, _ = shard_logits(hidden, weight, vocab_start, num_valid, bias, group)
    values, local_ids = logits.float().max(dim=1)
    pairs = torch.stack([values, (local_ids + vocab_start).float()], dim=1)  # [B, 2] float32
    batch = pairs.shape[0]
    if tp > 1:
        pairs = all_gather_single(pairs.contiguous(), group).view(tp, batch, 2)
    else:
        pairs = pairs.unsqueeze(0)
    best_rank = pairs[:, :, 0].argmax(dim=0)  # first rank wins ties; NaN wins
    ids = pairs[best_rank, torch.arange(batch, device=pairs.device), 1].to(torch.int64)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids


def gathered_logits(hidden, weight, vocab_start, num_valid, bias, group):
    """``[B, tp * rows]`` logits in the weight dtype on every rank (padding -inf):
    the local logits, all-gathered in rank order (the full-gather path)."""
    logits, _, tp = shard_logits(hidden, weight, vocab_start, num_valid, bias, group)
    batch, rows = logits.shape
    if tp > 1:
        gathered = all_gather_single(logits.contiguous(), group)  # [tp * B, rows]
        logits = gathered.view(tp, batch, rows).permute(1, 0, 2).reshape(batch, tp * rows)
    return logits


def full_gather_topk(hidden, weight, k: int, *, vocab_start=0, num_valid=None, bias=None, d2t=None, group=None):
    """Today's top-k path (tree drafting): local logits ``[B, rows]`` by torch
    matmul in the weight dtype, padding set to -inf, all-gather of the logits
    to ``[B, tp * rows]`` on every rank, ``torch.topk(k)``, then ``id + d2t[id]``.
    Sends ``B * rows * itemsize`` bytes per rank, like :func:`full_gather_argmax`.

    The top-k runs on logits rounded to the weight dtype, and ``torch.topk``
    does not specify the order of tied values, so ties (frequent in bf16) may
    come out in any order; :func:`localargmax.lm_head_topk` orders them by the
    smallest index. Padding (-inf) can only be returned for a row with fewer
    than ``k`` valid logits above -inf.

    Args:
        hidden: ``[B, H]``, the weight's dtype, the same on every rank.
        weight: ``[rows, H]`` this rank's shard (float32 / bfloat16 / float16).
        k: ``1 <= k <= tp * rows``.
        vocab_start, num_valid, bias, d2t, group: as in :func:`full_gather_argmax`.

    Returns:
        ``(ids [B, k] int64, values [B, k])``: ids (target ids with ``d2t``) in
        descending order of their logits ``values`` (in the weight dtype).

    Raises:
        ValueError for ``k`` out of range or a non-standard layout; TypeError
        when hidden and weight dtypes differ or ``group`` is not a ProcessGroup.
    """
    _, tp = _rank_and_size(group)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= tp * weight.shape[0]:
        raise ValueError(f"k must be an int in [1, tp * rows = {tp * weight.shape[0]}], got {k!r}")
    logits = gathered_logits(hidden, weight, vocab_start, num_valid, bias, group)
    values, ids = logits.topk(k, dim=1, sorted=True)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids, values


def full_gather_sample(
    hidden, weight, *, temperature, generator=None, vocab_start=0, num_valid=None, bias=None, d2t=None, group=None
):
    """Today's sampling path: all-gather the logits as in :func:`full_gather_argmax`
    (``[B, tp * rows]`` in the weight dtype, padding -inf, ``B * rows * itemsize``
    bytes sent per rank), then ``softmax(logits.float() / temperature)`` and
    ``torch.multinomial(probs, 1, generator=generator)``, then ``id + d2t[id]``.

    Every rank draws the sample itself from the same gathered probabilities. The
    ranks agree only if their generators are in the same state: create one per
    rank with the same seed (``torch.Generator(device).manual_seed(seed)``) and
    make the same calls on every rank (same hardware and torch version too).
    ``generator=None`` uses torch's global generator, which must then be seeded
    identically on every rank. Unlike :func:`localargmax.lm_head_sample`, the
    draw depends on the random stream and on the padded width ``tp * rows``, so
    it is not the same sample for another ``tp``. Padding has probability 0 and
    is never drawn.

    Args:
        hidden, weight, vocab_start, num_valid, bias, d2t, group: as in
            :func:`full_gather_argmax`.
        temperature: a float ``>= 0``; ``0`` is greedy (``argmax``, no draw).
        generator: a ``torch.Generator`` on the logits' device, or None.

    Returns:
        ``[B]`` int64 sampled ids (target ids with ``d2t``).

    Raises:
        ValueError for a negative, infinite, NaN or non-number temperature
        (the rule of :func:`localargmax.lm_head_sample`) or a
        non-standard layout; TypeError as in :func:`full_gather_argmax`;
        RuntimeError (from ``torch.multinomial``) for a row whose logits are
        all -inf or hold NaN or +inf.
    """
    temperature = check_row_number(temperature, "temperature", TEMPERATURE)  # the sampling steps' rule
    logits = gathered_logits(hidden, weight, vocab_start, num_valid, bias, group)
    if temperature == 0:
        ids = logits.argmax(dim=1)
    else:
        probs = torch.softmax(logits.float() / float(temperature), dim=1)
        ids = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    if d2t is not None:
        ids = ids + d2t[ids]
    return ids
