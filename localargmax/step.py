"""The whole local-argmax step of a vocab-parallel lm_head: fused local
kernel, one collective, merge, d2t."""
from __future__ import annotations

from typing import Optional

import torch

from .collective import _SIGN_BIT, Group, check_step_consistency, debug_enabled, exchange_keys
from .ops import check_d2t_arg, merge_keys, shard_argmax, shard_sample, shard_topk


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
        every rank if they differ. Without it, ranks called with different
        batch sizes make the collective fail or, on gloo, can return wrong
        ids: the batch size is trusted per step. A rank that never arrives
        surfaces as the group's own timeout (``init_process_group(timeout=...)``).
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



def _resolve_temperature(temperature, hidden: torch.Tensor) -> torch.Tensor:
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be a torch.Tensor [batch, hidden_size], got {type(hidden).__name__}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [batch, hidden_size], got shape {tuple(hidden.shape)}")
    if isinstance(temperature, torch.Tensor):
        if temperature.dim() == 0:
            temperature = temperature.reshape(1).expand(hidden.shape[0])
        return temperature.to(torch.float32).contiguous()  # values checked by shard_sample
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a float >= 0 (0 = greedy) or a float32 tensor [B], got {temperature!r}")
    return torch.full((hidden.shape[0],), float(temperature), dtype=torch.float32, device=hidden.device)


def lm_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    group: Group = None,
):
    """Global top-k of a vocab-parallel lm_head (tree drafting), without
    gathering logits: each rank's fused top-k (:func:`localargmax.shard_topk`),
    one all-gather of ``k`` keys per row per rank (``8·k·B`` bytes sent), and a
    merge that keeps the ``k`` largest keys.

    Same answer as ``torch.topk(logits, k, sorted=True)`` on the full unpadded
    logits, ties ordered by smallest index, NaN largest.

    Args:
        hidden, weight, vocab_start, num_valid, bias, d2t, group: as in
            :func:`lm_head_argmax` (a callable group gets keys ``[B, k]`` and
            returns ``[tp, B, k]``).
        k: ``1 <= k <= 64``, at most the valid vocabulary size.

    Returns:
        ``(ids [B, k] int64, values [B, k] float32)``: ids (target ids with
        ``d2t``) in descending order of their exact float32 logits ``values``.

    Raises:
        TypeError / ValueError for malformed inputs; ValueError when ``k``
        exceeds the valid vocabulary (on CPU; on CUDA such slots get id -1).
    """
    if group is None and isinstance(num_valid, int) and isinstance(k, int) and 1 <= k and num_valid < k:
        raise ValueError(f"k={k} exceeds the valid vocabulary (num_valid={num_valid})")
    keys = shard_topk(hidden, weight, k, vocab_start=vocab_start, num_valid=num_valid, bias=bias)
    if d2t is not None:
        check_d2t_arg(d2t, keys.device)
    gathered = exchange_keys(keys, group, "all_gather")  # [tp, B, k]
    batch = keys.shape[0]
    if batch == 0:
        return keys.new_empty((0, k)), keys.new_empty((0, k), dtype=torch.float32)
    candidates = gathered.permute(1, 0, 2).reshape(batch, -1) ^ _SIGN_BIT  # signed order == unsigned order
    merged = candidates.topk(k, dim=1, sorted=True).values ^ _SIGN_BIT
    if merged.device.type == "cpu" and not torch.compiler.is_compiling() and bool((merged == 0).any()):
        raise ValueError(f"k={k} exceeds the valid vocabulary summed over all ranks")
    # merge_keys of [1, B*k] decodes every kept key and applies d2t (range-checked on CPU)
    ids, values = merge_keys(merged.reshape(1, -1), d2t)
    return ids.view(batch, k), values.view(batch, k)


def lm_head_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    temperature,
    seed: int,
    offset: int = 0,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    group: Group = None,
    reduce: str = "all_gather",
) -> torch.Tensor:
    """Sample ``ids ~ softmax(logits / T)`` of a vocab-parallel lm_head with
    ``O(tp)`` communication: Gumbel-max, ``argmax_v (logit[b, v] / T[b] + g)``,
    where the noise ``g`` comes from Philox 4x32-10 keyed by
    ``(seed, offset + b, global index v)`` inside the fused kernel
    (:func:`localargmax.shard_sample`). The noise depends on the global index
    only, so the sample is identical for every TP size and shard layout
    (tp-invariant sampling); one key per row per rank is exchanged.

    Args:
        temperature: a float ``>= 0`` or a float32 tensor ``[B]``; ``T == 0``
            rows are greedy.
        seed: ``0 <= seed < 2**63``; offset: Philox subsequence of row 0
            (advance by ``B`` per step for fresh noise).
        Others: as in :func:`lm_head_argmax`.

    Returns:
        ``[B]`` int64 sampled ids (target ids with ``d2t``), the same on every rank.

    Raises:
        TypeError / ValueError naming the argument for malformed inputs, a
        negative or NaN temperature (checked for CPU tensors and Python floats).
    """
    t = _resolve_temperature(temperature, hidden)
    keys = shard_sample(hidden, weight, t, seed, offset, vocab_start=vocab_start, num_valid=num_valid, bias=bias)
    ids, _ = merge_keys(exchange_keys(keys, group, reduce), d2t)
    return ids
