"""The one collective of a local-argmax step: move one packed key per row per
rank, through ``torch.distributed`` (NCCL on GPUs, gloo on CPU).

This module is the single dispatch point for communicators: everything that
exchanges keys goes through :func:`exchange_keys`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Union

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .packed_key import SIGN_FLIP

REDUCE_MODES = ("all_gather", "all_reduce")


def all_gather_single(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``funcol.all_gather_single(tensor, 0, group)``, waited on: the ranks' tensors
    concatenated along dim 0. torch 2.11 has only the older name,
    ``all_gather_tensor``, which warns FutureWarning (deprecated) where
    ``all_gather_single`` exists (torch 2.13, 2.14.1, 2.15). Looked up at each
    call, so a test that patches ``funcol`` sees it."""
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return funcol.wait_tensor(gather(tensor, 0, group))


class _LocalShard:
    """The type of :data:`LOCAL_SHARD` (its one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "localargmax.LOCAL_SHARD"


LOCAL_SHARD = _LocalShard()
"""``group=LOCAL_SHARD``: no exchange, this shard's own answer (its winners
among its own ids), on purpose. ``group=None`` means world size 1, so a step
at ``vocab_start > 0`` refuses it (:func:`check_group`); a caller who wants
one shard's local answer says so with this sentinel."""

Group = Union[None, dist.ProcessGroup, Callable[[torch.Tensor], torch.Tensor], _LocalShard, Any]  # noqa: UP007
"""What ``group=`` takes: None (world size 1), a ProcessGroup, a callable
all-gather, :data:`LOCAL_SHARD`, or a ``cupy.cuda.nccl.NcclCommunicator``
(typed Any: cupy is optional). A runtime alias."""


def exchange_keys(keys: torch.Tensor, group: Group = None, reduce: str = "all_gather") -> torch.Tensor:
    """Exchange this rank's packed keys with the other TP ranks.

    Example::

        gathered = exchange_keys(frame_keys(keys, vocab_end), tp_group)  # [tp, L]

    Args:
        keys: ``[B]`` int64 packed keys from :func:`localargmax.shard_argmax`
            (or ``[B, k]`` from :func:`localargmax.shard_topk`, all-gather only).
        group: ``None`` (world size 1: no communication; likewise
            :data:`LOCAL_SHARD`, one shard on purpose), a
            ``torch.distributed.ProcessGroup`` (the default path), a
            ``cupy.cuda.nccl.NcclCommunicator`` (optional extra
            ``localargmax[cupy]``; CUDA keys, torch's current stream), or a
            callable ``all_gather(keys [B]) -> keys [tp, B]`` an engine already
            owns (e.g. its tensor-parallel all-gather).
        reduce: ``"all_gather"`` (``tp`` keys per row arrive, merged by
            :func:`localargmax.merge_keys`) or ``"all_reduce"`` (all-reduce MAX
            on sign-flipped keys: fewer bytes). Both give identical ids.

    Returns:
        ``[tp, *keys.shape]`` int64 keys, rank-major (``[1, B]`` after an
        all-reduce or for world size 1).

    Raises:
        ValueError for an unknown ``reduce`` mode, a callable with
        ``reduce="all_reduce"``, a callable returning the wrong shape, an NCCL
        group or communicator with CPU keys; TypeError for an unsupported
        ``group`` type; ImportError for a cupy communicator without cupy.
    """
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
        raise TypeError(
            f"keys must be an int64 torch.Tensor of packed keys, got {getattr(keys, 'dtype', type(keys).__name__)}"
        )
    if reduce not in REDUCE_MODES:
        raise ValueError(f"reduce must be one of {REDUCE_MODES}, got {reduce!r}")
    if reduce == "all_reduce" and keys.dim() != 1:
        raise ValueError(f"reduce='all_reduce' merges top-1 keys [B] only, got keys of shape {tuple(keys.shape)}")
    if group is None or group is LOCAL_SHARD:
        return keys.unsqueeze(0)
    if isinstance(group, dist.ProcessGroup):
        if dist.get_world_size(group) == 1:  # nothing to exchange: skip the collective's latency
            return keys.unsqueeze(0)
        backend = str(dist.get_backend(group))
        if backend == "nccl" and keys.device.type != "cuda":
            raise ValueError(
                f"group uses the NCCL backend but keys are on {keys.device}: use a gloo group for CPU tensors"
            )
        if reduce == "all_gather":
            return all_gather_single(keys, group).view(dist.get_world_size(group), *keys.shape)
        flipped = funcol.all_reduce(keys ^ SIGN_FLIP, "max", group)
        return (funcol.wait_tensor(flipped) ^ SIGN_FLIP).unsqueeze(0)
    if _is_nccl_communicator(group):
        return _exchange_with_cupy_nccl(keys, group, reduce)
    if callable(group):
        if reduce != "all_gather":
            raise ValueError("a callable group is an all-gather: use reduce='all_gather'")
        gathered = group(keys)
        if (
            not isinstance(gathered, torch.Tensor)
            or gathered.dim() != keys.dim() + 1
            or gathered.shape[1:] != keys.shape
        ):
            shape = tuple(gathered.shape) if isinstance(gathered, torch.Tensor) else type(gathered).__name__
            want = ", ".join(["tp"] + [f"{n}" for n in keys.shape])
            raise ValueError(
                f"the group callable must return [{want}], an all-gather of the {tuple(keys.shape)} int64 tensor it is "
                f"given, got {shape}"
            )
        return gathered
    raise TypeError(
        "group must be None, localargmax.LOCAL_SHARD, a torch.distributed.ProcessGroup, a "
        f"cupy.cuda.nccl.NcclCommunicator or a callable all_gather(keys [B]) -> [tp, B], got {type(group).__name__}"
    )


def exchange_step(payload: torch.Tensor, group: Group, reduce: str = "all_gather", *, vocab_start=0,
                  debug: dict[str, int] | None = None) -> torch.Tensor:  # fmt: skip
    """A step's exchange, the one place the steps hand their ``group`` to:
    :func:`check_group` first (before anything uses the group: once a step,
    here at its first exchange), then, with ``debug`` (``LOCALARGMAX_DEBUG=1``:
    what this rank was called with, by name), :func:`check_step_consistency`,
    then :func:`exchange_keys` of the framed ``payload`` (:func:`frame_keys`).
    The filtered step's second exchange, on the group checked here, is
    :func:`exchange_logits`."""
    check_group(group, vocab_start=vocab_start)
    return _exchange_frame(payload, group, reduce, debug)


def _exchange_frame(payload: torch.Tensor, group: Group, reduce: str, debug: dict[str, int] | None) -> torch.Tensor:
    """:func:`check_step_consistency` of ``debug`` (if given), then :func:`exchange_keys` of ``payload``."""
    if debug is not None:
        check_step_consistency(group, list(debug.values()), list(debug))
    return exchange_keys(payload, group, reduce)


_INIT_HINT = (
    "torch.distributed.group.WORLD is None until torch.distributed.init_process_group() is called, and "
    "group=None means one rank holding the whole vocabulary"
)


def _group_size(group: Group) -> int | None:
    """Ranks in ``group``: 1 for None, the size of a ProcessGroup or cupy
    communicator, None for a callable (it cannot be seen)."""
    if group is None:
        return 1
    if isinstance(group, dist.ProcessGroup):
        return dist.get_world_size(group)
    if _is_nccl_communicator(group):
        return int(group.size())
    return None


def check_group(group: Group, *, vocab_start=0, world_size: int | None = None, rank: int | None = None,
                what: str = "group") -> None:  # fmt: skip
    """Refuse a TP set-up that is inconsistent for certain, before any kernel
    runs: a group of one rank (``None`` included: ``dist.group.WORLD``
    before ``init_process_group``) where the caller is a TP rank, that is

    * ``world_size``/``rank`` given (a module or layout built for them):
      ``world_size > 1`` or ``rank > 0``. (A ProcessGroup of another size or
      rank is found by :func:`localargmax.check_layouts`, on every rank alike.)
    * otherwise (the ops and steps, which know only their shard):
      ``vocab_start > 0``. Rank 0 of a larger TP group called with
      ``group=None`` cannot be told from world size 1: it returns its own
      shard's winners.

    :data:`LOCAL_SHARD` (one shard's own answer, on purpose) and a callable
    (its size cannot be seen) always pass.

    Raises:
        ValueError naming ``what``, ``torch.distributed.init_process_group``
        and, for a step, ``localargmax.LOCAL_SHARD``.
    """
    if group is LOCAL_SHARD:
        return
    size = _group_size(group)
    if world_size is not None:
        r = 0 if rank is None else rank
        if size == 1 and (world_size > 1 or r > 0):
            kind = "None" if group is None else "a process group of one rank"
            raise ValueError(
                f"{what} is {kind}, but this lm_head is TP rank {r} of world_size {world_size}: pass the TP process "
                f"group (call torch.distributed.init_process_group() first; {_INIT_HINT})"
            )
        return
    if size == 1 and isinstance(vocab_start, int) and not isinstance(vocab_start, bool) and vocab_start > 0:
        kind = "None" if group is None else "a group of one rank"
        raise ValueError(
            f"{what} is {kind} but vocab_start={vocab_start}: a shard past id 0 is one TP rank of several, and "
            f"without its group it would return only its own shard's winners. Pass the TP process group (call "
            f"torch.distributed.init_process_group() first; {_INIT_HINT}), or group=localargmax.LOCAL_SHARD for "
            "this shard's own answer on purpose"
        )


HEADER_LEN = 3
"""int64 words every rank sends before its keys in a step's exchange (see :func:`frame_keys`)."""

PAIRS_FLAG = 1 << 40
"""Added to the header's size word when log-partition pairs follow the keys (see :func:`frame_keys`)."""


def padded_words(words: int, align_bytes: int = 8) -> int:
    """``words`` int64 words rounded up to a multiple of ``align_bytes`` bytes
    (a power of two >= 8): the padding rule of a collective that takes whole
    16-byte units (vLLM's custom all-gather), the same on every rank."""
    if align_bytes < 8 or align_bytes & (align_bytes - 1):
        raise ValueError(f"align_bytes must be a power of two >= 8, got {align_bytes!r}")
    per = align_bytes // 8
    return -(-words // per) * per


def payload_length(
    batch: int, k: int = 1, log_probs: bool = False, align_bytes: int = 8, log_odds: bool = False
) -> int:
    """Int64 words one rank sends in a step's exchange (:func:`frame_keys`):
    the :data:`HEADER_LEN`-word header, ``batch·k`` keys, then ``batch``
    log-partition words with ``log_probs`` or ``log_odds`` (one word serves
    both). A callable ``group`` is handed a
    ``[payload_length(...)]`` int64 tensor and returns ``[tp, payload_length(...)]``;
    an engine that preallocates its gather buffer (for CUDA graphs) sizes it
    from this. Bytes per rank: ``8 * payload_length(...)``.

    Example::

        buffer = torch.empty(tp, payload_length(B, k=8), dtype=torch.int64, device="cuda")

    Args:
        batch: rows ``B >= 0``; k: keys per row (1 for argmax and sampling,
            ``k`` for top-k); log_probs / log_odds: whether the step has
            ``return_log_probs=True`` / ``return_log_odds=True``.
        align_bytes: pad to a multiple of this many bytes (:func:`padded_words`;
            the vLLM plugin sends 16-byte multiples).

    Raises:
        ValueError for a negative ``batch``, ``k < 1`` or a bad ``align_bytes``.
    """
    for name, value, low in (("batch", batch, 0), ("k", k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return padded_words(batch * k + (batch if log_probs or log_odds else 0) + HEADER_LEN, align_bytes)


def frame_keys(keys: torch.Tensor, vocab_end: int, pairs: torch.Tensor | None = None) -> torch.Tensor:
    """One rank's payload for a step's key exchange: a 3-word header
    ``[size, -size, vocab_end]``, ``size = n + 1`` (``n = keys.numel()``)
    plus :data:`PAIRS_FLAG` when pairs follow, then its keys, flattened, then
    (with ``pairs``) one int64 word per batch row holding the row's
    log-partition pair.

    The header sits at a fixed offset (words ``0:3``), whatever the batch:
    a step compiled with a dynamic batch reads it without specialising the
    batch size. After an all-gather every rank sees every rank's header;
    after an all-reduce MAX (unsigned, see :func:`exchange_keys`) it sees
    ``[max n + 1, -(min n + 1), max vocab_end]``. Either way a rank can tell,
    from values all ranks share, whether the ranks sent the same number of
    keys (the same batch size and ``k``) and the end of the valid vocabulary
    over all ranks — 24 bytes per rank per step, whatever the batch
    (DESIGN.md, "The step's exchange").

    The flag is part of the size word, so ranks that disagree on whether
    log-probabilities are exchanged fail the same check as ranks that
    disagree on the batch size (DESIGN.md, "The step's exchange").

    Args:
        keys: ``[B]`` or ``[B, k]`` int64 packed keys.
        vocab_end: ``vocab_start + num_valid`` of this rank's shard, or 0
            when it is empty (``num_valid == 0``: it holds no id).
        pairs: optional ``[B, 2]`` float32 log-partition pairs ``(ref, others)``
            (:func:`localargmax.shard_argmax` with ``log_partition=True``),
            sent as their bits: word ``b`` is the 8 bytes of row ``b``'s
            ``(ref, others)`` in memory order (a bit-cast view, no conversion).

    Returns:
        ``[3 + n + B]`` (``[3 + n]`` without pairs) int64, on the device of
        ``keys``; built without a host-to-device copy (fills only), so it is
        capturable in a CUDA graph.
    """
    size = keys.numel() + 1 + (PAIRS_FLAG if pairs is not None else 0)
    if pairs is None:
        return _frame(size, vocab_end, keys.reshape(-1))
    return _frame(size, vocab_end, keys.reshape(-1), pairs_to_words(pairs))


def _frame(size: int, vocab_end: int, *body: torch.Tensor) -> torch.Tensor:
    """The one frame of every exchange: the header ``[size, -size,
    vocab_end]`` (:data:`HEADER_LEN` words), then the ``body`` words (int64),
    in order. On a device the header is built without a host-to-device copy
    (fills only), so a frame is capturable in a CUDA graph."""
    if body[0].device.type == "cpu":
        header = torch.tensor([size, -size, vocab_end], dtype=torch.int64)
    else:  # fills, no host-to-device copy
        header = body[0].new_full((HEADER_LEN,), size)
        header[1:2].fill_(-size)  # (a Python-int setitem copies a CPU scalar: refused in graph capture)
        header[2:3].fill_(vocab_end)
    return torch.cat([header, *body])


LOGITS_FLAG = 1 << 41
"""Added to the header's size word of the filtered step's fallback frame
(:func:`frame_logits`): a rank that sends logits where the others send keys
fails the size check."""

LOGITS_FIELDS = 3
"""int64 words after the header of a fallback frame, before its logits:
``[vocab_start, n_rows, shard_rows]`` (see :func:`frame_logits`)."""


def logits_payload_length(n_rows: int, shard_rows: int) -> int:
    """Int64 words one rank sends in the fallback gather (:func:`frame_logits`):
    the :data:`HEADER_LEN`-word header, :data:`LOGITS_FIELDS` words, and the
    rows' float32 logits, two per word."""
    return HEADER_LEN + LOGITS_FIELDS + (n_rows * shard_rows + 1) // 2


def frame_logits(logits: torch.Tensor, vocab_start: int, num_valid: int) -> torch.Tensor:
    """One rank's payload for the filtered step's fallback gather, in the one
    frame of :func:`frame_keys`: the header ``[size, -size, vocab_end]``
    (``size`` = the words after it plus one, plus :data:`LOGITS_FLAG`;
    ``vocab_end`` = ``vocab_start + num_valid``, 0 for an empty shard), the
    words ``[vocab_start, n_rows, shard_rows]``, then the ``[n_rows,
    shard_rows]`` float32 logits as their bits, two per int64 word
    (zero-padded to a whole word). Every rank's weight must have the same
    ``shard_rows`` (vLLM pads the shards equally). Read back by
    :func:`logits_from_frames`."""
    n, shard_rows = logits.shape
    values = logits.to(torch.float32).contiguous().reshape(-1)
    if values.numel() % 2:
        values = torch.cat([values, values.new_zeros(1)])
    fields = torch.tensor([vocab_start, n, shard_rows], dtype=torch.int64).to(logits.device)
    size = LOGITS_FIELDS + values.numel() // 2 + 1 + LOGITS_FLAG
    return _frame(size, vocab_start + num_valid if num_valid else 0, fields, values.view(torch.int64))


def logits_from_frames(gathered: torch.Tensor) -> torch.Tensor:
    """``[n_rows, vocab]`` float32 logits from every rank's :func:`frame_logits`
    (``gathered [tp, L]``), each shard's valid columns at its place and NaN in
    the gaps between shards. ValueError, on every rank alike, if the ranks
    sent different row counts or shard sizes (or one sent no fallback frame)."""
    heads = gathered[:, : HEADER_LEN + LOGITS_FIELDS].tolist()
    size = heads[0][0]
    n, shard_rows = heads[0][HEADER_LEN + 1 :]
    agree = lambda h: h[:2] == [size, -size] and h[HEADER_LEN + 1 :] == [n, shard_rows]  # noqa: E731
    if size < LOGITS_FLAG or not all(agree(h) for h in heads):
        got = [h[HEADER_LEN + 1 :] if h[0] >= LOGITS_FLAG else "not a fallback frame" for h in heads]
        raise ValueError(f"the TP ranks disagree on the fallback gather (rows, shard rows): {got}")
    vocab = max(h[2] for h in heads)
    full = torch.full((n, vocab), math.nan, dtype=torch.float32, device=gathered.device)
    for r, (_, _, end, start, _, _) in enumerate(heads):
        valid = end - start if end else 0
        part = gathered[r, HEADER_LEN + LOGITS_FIELDS :].view(torch.float32)[: n * shard_rows].view(n, shard_rows)
        full[:, start : start + valid] = part[:, :valid]
    return full


def exchange_logits(logits: torch.Tensor, group: Group, *, vocab_start: int, num_valid: int,
                    debug: dict[str, int] | None = None) -> torch.Tensor:  # fmt: skip
    """The filtered step's fallback gather, on the group its first exchange
    (:func:`exchange_step`) checked: this rank's ``[n_rows, shard_rows]``
    logits framed (:func:`frame_logits`), all-gathered (with ``debug``, the
    ranks' calls compared first, as there), and read back as the rows' full
    ``[n_rows, vocab]`` logits (:func:`logits_from_frames`)."""
    return logits_from_frames(_exchange_frame(frame_logits(logits, vocab_start, num_valid), group, "all_gather", debug))


def pairs_to_words(pairs: torch.Tensor) -> torch.Tensor:
    """``[B, 2]`` float32 pairs -> ``[B]`` int64 words (their bits)."""
    if not isinstance(pairs, torch.Tensor) or pairs.dtype != torch.float32 or pairs.dim() != 2 or pairs.shape[1] != 2:
        raise ValueError(
            f"pairs must be a [batch, 2] float32 tensor of log-partition pairs, got {getattr(pairs, 'shape', pairs)}"
        )
    return pairs.contiguous().view(torch.int64).reshape(-1)


def words_to_pairs(words: torch.Tensor) -> torch.Tensor:
    """``[..., B]`` int64 words -> ``[..., B, 2]`` float32 pairs (the inverse of :func:`pairs_to_words`)."""
    return words.contiguous().view(torch.float32).reshape(*words.shape, 2)


def _is_nccl_communicator(group) -> bool:
    """A cupy ``NcclCommunicator`` (duck-typed: cupy is an optional extra)."""
    return all(hasattr(group, a) for a in ("allGather", "allReduce", "size", "rank_id"))


def require_cupy_nccl():
    """``cupy.cuda.nccl``, or ImportError naming the optional extra (a cupy communicator was passed as group)."""
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise ImportError(
            "a cupy NcclCommunicator was passed as group but cupy is not importable; "
            "install the optional extra: pip install 'localargmax[cupy]'"
        ) from e
    return nccl


def _exchange_with_cupy_nccl(keys: torch.Tensor, comm, reduce: str) -> torch.Tensor:
    """The key exchange over a cupy NCCL communicator, on torch's current stream."""
    nccl = require_cupy_nccl()
    if keys.device.type != "cuda":
        raise ValueError(f"a cupy NCCL communicator needs CUDA keys, got keys on {keys.device}")
    stream = torch.cuda.current_stream(keys.device).cuda_stream
    keys = keys.contiguous()
    if reduce == "all_gather":
        out = torch.empty((comm.size(), *keys.shape), dtype=torch.int64, device=keys.device)
        comm.allGather(keys.data_ptr(), out.data_ptr(), keys.numel(), nccl.NCCL_INT64, stream)
        return out
    flipped = keys ^ SIGN_FLIP
    out = torch.empty_like(flipped)
    comm.allReduce(flipped.data_ptr(), out.data_ptr(), keys.numel(), nccl.NCCL_INT64, nccl.NCCL_MAX, stream)
    return (out ^ SIGN_FLIP).unsqueeze(0)


def check_step_consistency(group: Group, fields: Sequence[int], names: Sequence[str]) -> None:
    """Opt-in per-step check (``LOCALARGMAX_DEBUG=1``, :mod:`localargmax.envs`): all-gather a few ints
    describing this rank's call (batch size, hidden size, ...) and raise, on
    every rank alike, if they differ. Without it a rank with another batch size
    makes the key collective read garbage or fail obscurely.

    Raises:
        ValueError naming the field and the ranks that disagree.
    """
    if not isinstance(group, dist.ProcessGroup):
        return
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if str(dist.get_backend(group)) == "nccl"
        else torch.device("cpu")
    )
    mine = torch.tensor(list(fields), dtype=torch.int64, device=device)
    table = all_gather_single(mine, group).view(-1, len(fields)).cpu()
    for column, name in enumerate(names):
        values = {}
        for rank, value in enumerate(table[:, column].tolist()):
            values.setdefault(value, []).append(rank)
        if len(values) > 1:
            detail = "; ".join(f"ranks {ranks}: {value}" for value, ranks in values.items())
            raise ValueError(f"LOCALARGMAX_DEBUG: ranks disagree on {name} ({detail})")
