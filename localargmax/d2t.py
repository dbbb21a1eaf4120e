"""EAGLE-3 style draft-to-target vocabulary maps (``d2t``).

A draft model with a smaller vocabulary predicts draft id ``k``; the target
token is ``k + d2t[k]`` (EAGLE-3's offset table, also vLLM's
``draft_id_to_target_id``).
"""

from __future__ import annotations

import torch


def build_d2t(token_counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The d2t table of a draft vocabulary made of the ``draft_vocab_size`` most
    frequent target tokens, kept in target-id order (EAGLE-3's recipe).

    Example::

        d2t = build_d2t(torch.bincount(corpus_ids, minlength=vocab), 32000)  # [32000] int64

    Args:
        token_counts: ``[target_vocab]`` counts of each target token in a corpus.
        draft_vocab_size: K, ``1 <= K <= target_vocab``. Ties in count go to the
            smaller target id.

    Returns:
        ``[K]`` int64 ``d2t`` with ``draft_to_target = arange(K) + d2t``,
        strictly increasing target ids.

    Raises:
        ValueError for a non-1-D ``token_counts`` or K out of range.
    """
    if not isinstance(token_counts, torch.Tensor) or token_counts.dim() != 1:
        raise ValueError("token_counts must be a 1-D tensor [target_vocab]")
    if token_counts.is_floating_point() and bool(token_counts.isnan().any() | (token_counts < 0).any()):
        raise ValueError("token_counts must be non-negative counts without NaN")
    target_vocab = token_counts.shape[0]
    if (
        isinstance(draft_vocab_size, bool)
        or not isinstance(draft_vocab_size, int)
        or not 1 <= draft_vocab_size <= target_vocab
    ):
        raise ValueError(f"draft_vocab_size must be an int in [1, {target_vocab}], got {draft_vocab_size!r}")
    # Stable sort by descending count: equal counts keep ascending id order.
    order = torch.sort(token_counts.to(torch.float64), descending=True, stable=True).indices
    target_ids = torch.sort(order[:draft_vocab_size]).values.to(torch.int64)
    return target_ids - torch.arange(draft_vocab_size, dtype=torch.int64)


def draft_to_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """``[K]`` int64 target id of each draft id: ``arange(K) + d2t``."""
    return torch.arange(d2t.shape[0], dtype=torch.int64, device=d2t.device) + d2t


def validate_d2t(d2t: torch.Tensor, draft_vocab_size: int, target_vocab_size: int) -> None:
    """Check a d2t table once, at load time (it is not re-checked per step).

    Raises:
        TypeError if ``d2t`` is not an int64 tensor; ValueError if it is not 1-D
        of length ``draft_vocab_size`` or some ``k + d2t[k]`` falls outside
        ``[0, target_vocab_size)`` (the message names the first bad ``k``).
    """
    if not isinstance(d2t, torch.Tensor):
        raise TypeError(f"d2t must be an int64 torch.Tensor [draft_vocab], got {type(d2t).__name__}")
    if d2t.dtype != torch.int64:
        raise TypeError(f"d2t must be int64, got {d2t.dtype}")
    if d2t.dim() != 1 or d2t.shape[0] != draft_vocab_size:
        raise ValueError(f"d2t must be 1-D [draft_vocab_size={draft_vocab_size}], got shape {tuple(d2t.shape)}")
    target = draft_to_target_ids(d2t.cpu())
    bad = ((target < 0) | (target >= target_vocab_size)).nonzero()
    if bad.numel():
        k = int(bad[0])
        raise ValueError(
            f"d2t maps draft id {k} to target id {int(target[k])}, outside [0, target_vocab_size={target_vocab_size}) "
            f"({bad.numel()} bad entries)"
        )
