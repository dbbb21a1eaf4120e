"""The greedy steps of a vocab-parallel lm_head, :func:`lm_head_argmax` and
:func:`lm_head_topk`: fused local kernel, one collective, merge, d2t (the
engine they share with sampling: :mod:`localargmax.engine`)."""

from __future__ import annotations

import torch

from .collective import Group
from .plan import StepPlan

__all__ = ["lm_head_argmax", "lm_head_topk"]


def lm_head_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    group: Group = None,
    reduce: str = "all_gather",
    return_log_probs: bool = False,
    logit_scale: float = 1.0,
    soft_cap: float | None = None,
    return_log_odds: bool = False,
    temperature=None,
):
    """Greedy token ids of a vocab-parallel lm_head, without gathering logits.

    Every TP rank calls this with its own shard: each reduces its shard to one
    packed key per row (:func:`localargmax.shard_argmax`), the ranks exchange
    ``tp`` keys per row instead of ``rows`` logits, and every rank merges them
    to the same ids (:func:`localargmax.merge_keys`).

    Example::

        shard = localargmax.shard_vocab(vocab_size, rank, world_size)
        ids = lm_head_argmax(hidden, weight, vocab_start=shard.vocab_start,
                             num_valid=shard.num_valid, group=tp_group)  # [B], same on every rank

    Args:
        hidden: ``[B, H]`` float32 / bfloat16 / float16, the same on every rank.
        weight: ``[rows, H]`` this rank's shard, rows contiguous.
        vocab_start: global index of this rank's row 0 (:func:`localargmax.shard_vocab`).
        num_valid: this rank's vocabulary rows (the rest is padding); default ``rows``.
        bias: ``[rows]`` bias shard, or None.
        d2t: ``[draft_vocab]`` int64 EAGLE-3 offsets, or None; ids are then
            ``k + d2t[k]``. Checked once at load time
            (:func:`localargmax.validate_d2t`), not per step.
        group: None (world size 1), a ``torch.distributed.ProcessGroup``, or a
            callable all-gather: handed ``[L]`` int64 (``L =
            localargmax.payload_length(B, 1, return_log_probs or return_log_odds)``), it returns
            ``[tp, L]``. None or a group of one rank with ``vocab_start > 0``
            is refused (a forgotten ``init_process_group``);
            :data:`localargmax.LOCAL_SHARD` returns this shard's own winners
            on purpose.
        reduce: ``"all_gather"`` or ``"all_reduce"`` (MAX of the keys); the same ids.
        return_log_probs: also return each id's log-probability over the full
            unpadded vocabulary, from log-partition pairs computed in the same
            pass and sent in the same exchange (one more word per row); needs
            ``"all_gather"``. Accuracy: DESIGN.md, "Log-probabilities".
        logit_scale: finite float ``>= 2**-126``, with ``return_log_probs`` / ``return_log_odds``
            only (vLLM's order: soft-cap, then scale). The ops call it
            ``scale`` (:func:`localargmax.shard_argmax`); the steps and the
            module take the model's name for it, vLLM's ``logit_scale``
            (DESIGN.md, "Log-probabilities").
        soft_cap: None or a finite float ``>= 2**-126``, likewise.
        return_log_odds: also return the argmax's log-odds at ``temperature``,
            ``-log Σ_{z ≠ argmax} exp((x_z - x_max) / T)`` over the full
            unpadded vocabulary of the transformed logits ``x`` (what vLLM's
            adaptive verification estimates acceptance from; DESIGN.md,
            "Log-odds"), from the same pairs and exchange as the
            log-probabilities: one word per row beside the key, with or
            without ``return_log_probs``. Needs ``"all_gather"``.
        temperature: with ``return_log_odds`` only: a finite float or a
            float32 tensor ``[B]`` (or ``[]``) on ``hidden``'s device; rows
            with ``T <= 0`` use 1 (vLLM's rule). The log-probabilities, if
            asked for too, are then under ``softmax(x / T)``. Default 1.

    Returns:
        ``[B]`` int64 ids, identical on every rank: ``torch.argmax`` of the full
        unpadded logits (ties to the smallest index, NaN wins); then, in this
        order, ``log_probs [B] float32`` with ``return_log_probs`` and
        ``log_odds [B] float32`` with ``return_log_odds`` (a tuple when
        either is asked for). Log-odds: ``<= 0`` for a tied maximum, NaN for
        a row whose maximum is NaN or infinite (an all ``-inf`` row included)
        and, on a device, for a non-finite temperature.

    Raises:
        TypeError / ValueError naming the argument for malformed inputs. After
        the exchange, from what every rank received (so all reach one
        verdict): ValueError on CPU, one ``torch._assert_async`` on CUDA, if
        the ranks sent different numbers of keys, a key decodes outside the
        vocabulary or ``d2t`` does not cover it. With ``LOCALARGMAX_DEBUG=1``,
        ValueError naming the input and the ranks that disagree, before the
        exchange. A rank that never arrives is the group's timeout. ValueError
        for a ``temperature`` without ``return_log_odds``, or a non-finite
        one known on the host; ValueError naming ``init_process_group`` for
        ``group`` None (or of one rank) with ``vocab_start > 0``.
    """
    plan = StepPlan(
        weight, vocab_start=vocab_start, num_valid=num_valid, bias=bias, d2t=d2t, group=group, reduce=reduce,
        return_log_probs=return_log_probs, return_log_odds=return_log_odds, logit_scale=logit_scale, soft_cap=soft_cap,
    )  # fmt: skip
    return plan.run(hidden, temperature=temperature)


def lm_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    group: Group = None,
    return_log_probs: bool = False,
    logit_scale: float = 1.0,
    soft_cap: float | None = None,
):
    """Global top-k of a vocab-parallel lm_head (tree drafting), without
    gathering logits: each rank's fused top-k (:func:`localargmax.shard_topk`),
    one all-gather of ``k`` keys per row per rank (``8·k·B`` bytes sent), and a
    merge that keeps the ``k`` largest keys.

    Same answer as ``torch.topk(logits, k, sorted=True)`` on the full unpadded
    logits, ties ordered by smallest index, NaN largest.

    Example::

        ids = lm_head_topk(hidden, weight, 4, vocab_start=shard.vocab_start,
                           num_valid=shard.num_valid, group=tp_group)  # [B, 4]

    Args:
        hidden, weight, vocab_start, num_valid, bias, d2t, group: as in
            :func:`lm_head_argmax` (a callable group gets ``[L]``, ``L =
            payload_length(B, k, return_log_probs)``, and returns ``[tp, L]``).
        k: ``1 <= k <= 64``, at most the valid vocabulary size.
        return_log_probs, logit_scale, soft_cap: as in :func:`lm_head_argmax`
            (``8·k·B + 8·B + 24`` bytes per rank).

    Returns:
        ``(ids [B, k] int64, values [B, k] float32)``: ids (target ids with
        ``d2t``) in descending order of their exact float32 logits ``values``.
        With ``return_log_probs``, ``values`` are the log-probabilities
        ``x - logsumexp(x)`` of the transformed logits ``x``.

    Raises:
        TypeError / ValueError for malformed inputs; ValueError when ``k``
        exceeds the valid vocabulary (on CPU; on CUDA such slots get id -1).
    """
    plan = StepPlan(
        weight, kind="topk", k=k, vocab_start=vocab_start, num_valid=num_valid, bias=bias, d2t=d2t, group=group,
        return_log_probs=return_log_probs, logit_scale=logit_scale, soft_cap=soft_cap,
    )  # fmt: skip
    return plan.run(hidden)
