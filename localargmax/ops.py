"""Thin wrappers over ``torch.ops.localargmax.*`` with their docstrings, argument
checks and fake (meta) kernels for ``torch.compile``.

The packed key (DESIGN.md, "The packed key") is an ``int64`` tensor holding the
bits of the unsigned 64-bit key

    key = (ordered(value) << 32) | (0xFFFFFFFF - global_index)

so that the unsigned maximum over any set of keys is ``torch.argmax``'s answer
over the same entries (larger value, NaN above all, then smaller index). Key 0
means "no valid entry".
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _C  # noqa: F401  (loads the library: registers torch.ops.localargmax)

MAX_GLOBAL_INDEX = 0xFFFFFFFE
"""Largest global vocabulary index a packed key can carry (2**32 - 2)."""

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_tensor(name: str, value, dims: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {dims}, got {type(value).__name__}")


def check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid) -> None:
    """Raise ValueError/TypeError naming the argument if the shard_argmax inputs
    are malformed. Shared by the public wrapper and the fake kernel."""
    _check_tensor("hidden", hidden, "[batch, hidden_size]")
    _check_tensor("weight", weight, "[rows, hidden_size]")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [rows, hidden_size], got shape {tuple(weight.shape)}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [batch, hidden_size], got shape {tuple(hidden.shape)}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"weight dtype must be float32, bfloat16 or float16, got {weight.dtype}")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden dtype ({hidden.dtype}) must equal weight dtype ({weight.dtype})")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden is {tuple(hidden.shape)} and weight is {tuple(weight.shape)}: "
            "their last dimension (hidden_size) must match"
        )
    if hidden.device != weight.device:
        raise ValueError(f"hidden is on {hidden.device} but weight is on {weight.device}; both must be on one device")
    if weight.shape[1] > 1 and weight.stride(1) != 1:
        raise ValueError(
            f"weight rows must be contiguous (stride(1) == 1), got strides {weight.stride()}; "
            "call weight.contiguous() once at load time"
        )
    for name, value in (("vocab_start", vocab_start), ("num_valid", num_valid)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if vocab_start < 0:
        raise ValueError(f"vocab_start must be >= 0, got {vocab_start}")
    rows = weight.shape[0]
    if not 0 <= num_valid <= rows:
        raise ValueError(f"num_valid must be in [0, rows={rows}], got {num_valid}")
    if num_valid > 0 and vocab_start + num_valid - 1 > MAX_GLOBAL_INDEX:
        raise ValueError(
            f"global indices up to vocab_start + num_valid - 1 = {vocab_start + num_valid - 1} exceed "
            f"{MAX_GLOBAL_INDEX}, the largest index a packed key holds (32 bits)"
        )
    if bias is not None:
        _check_tensor("bias", bias, f"[rows={rows}]")
        if bias.dim() != 1 or bias.shape[0] != rows:
            raise ValueError(f"bias must be 1-D [rows={rows}], got shape {tuple(bias.shape)}")
        if bias.dtype not in (torch.float32, weight.dtype):
            raise TypeError(f"bias dtype must be float32 or the weight dtype ({weight.dtype}), got {bias.dtype}")
        if bias.device != weight.device:
            raise ValueError(f"bias is on {bias.device} but weight is on {weight.device}")


def check_merge_keys_args(keys, d2t) -> None:
    """Raise ValueError/TypeError naming the argument if merge_keys inputs are malformed."""
    _check_tensor("keys", keys, "[tp, batch] or [batch]")
    if keys.dim() not in (1, 2):
        raise ValueError(f"keys must be [tp, batch] or [batch], got shape {tuple(keys.shape)}")
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must be int64 packed keys, got {keys.dtype}")
    if keys.dim() == 2 and keys.shape[0] == 0 and keys.shape[1] > 0:
        raise ValueError(f"keys has 0 ranks (shape {tuple(keys.shape)})")
    if d2t is not None:
        check_d2t_arg(d2t, keys.device)


def check_d2t_arg(d2t, device) -> None:
    """Per-step d2t checks (dtype, rank, device); its contents are checked once
    at load time by :func:`localargmax.validate_d2t`."""
    _check_tensor("d2t", d2t, "[draft_vocab] int64")
    if d2t.dim() != 1:
        raise ValueError(f"d2t must be 1-D [draft_vocab], got shape {tuple(d2t.shape)}")
    if d2t.dtype != torch.int64:
        raise TypeError(f"d2t must be int64, got {d2t.dtype}")
    if d2t.device != device:
        raise ValueError(f"d2t is on {d2t.device} but the keys are on {device}")


def shard_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused ``hidden @ weight.T (+ bias)`` and row-wise argmax over one vocab shard.

    The logits are never materialized: each row's best entry is reduced on the
    fly to one packed key (DESIGN.md, "The packed key").

    Args:
        hidden: ``[B, H]`` hidden states; float32, bfloat16 or float16; any device
            the library was built for (CPU always, CUDA when compiled).
        weight: ``[rows, H]`` this rank's lm_head shard, same dtype and device as
            ``hidden``, rows contiguous (``stride(1) == 1``).
        vocab_start: global vocabulary index of the shard's row 0 (>= 0).
        num_valid: rows ``[0, num_valid)`` are vocabulary; rows at or past it are
            padding and never win (DESIGN.md rule 4). Default: all rows.
        bias: optional ``[rows]`` float32 or weight-dtype bias.

    Returns:
        ``[B]`` int64 packed keys; 0 for every row when ``num_valid == 0``.
        Products are accumulated in float32; the per-row order depends on ``k``
        only, so identical weight rows give identical logits (rule 5).

    CUDA: bf16 / fp16 run on one of three paths (``csrc/cuda/
    shard_argmax_cuda.cu``): ``mma``, the tensor-core fused kernel (sm_80+,
    ``H``, row strides multiples of 8, 16-byte aligned data); ``gemm`` from
    batch 128 (``LOCALARGMAX_CUDA_GEMM_MIN_BATCH``): cuBLAS float32 logits
    of a batch chunk, then a keys kernel; ``simt``, the CUDA-core fused
    kernel, for everything else (and for float32). ``LOCALARGMAX_CUDA_PATH=
    simt|mma|gemm`` forces one where it applies. The paths differ only in
    the float32 summation order of the dot products.

    Raises:
        TypeError / ValueError: naming the argument, for wrong ranks, shapes,
            dtypes, devices, non-contiguous weight rows, ``num_valid`` outside
            ``[0, rows]``, ``vocab_start < 0`` or global indices past 2**32 - 2;
            ValueError for a bad ``LOCALARGMAX_CUDA_PATH`` /
            ``LOCALARGMAX_CUDA_GEMM_MIN_BATCH`` on CUDA.
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    return torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, vocab_start, num_valid)


def merge_keys(keys: torch.Tensor, d2t: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge the ranks' packed keys, decode, and map draft ids to target ids.

    Args:
        keys: ``[tp, B]`` (rank-major, as an all-gather along dim 0 lays them
            out) or ``[B]`` int64 packed keys.
        d2t: optional ``[draft_vocab]`` int64 offset table; the result is
            ``k + d2t[k]`` for the winning draft id ``k`` (EAGLE-3 convention).

    Returns:
        ``(ids, values)``: ``ids`` ``[B]`` int64 global (or target) vocabulary
        ids; ``values`` ``[B]`` float32, the winning logit, exact.

    Raises:
        TypeError / ValueError for malformed inputs. On CPU also ValueError when
        a row has no valid entry on any rank (all keys 0) or the winning draft id
        lies outside ``d2t``; on CUDA (no host sync allowed) those rows get id -1
        and value NaN instead.
    """
    check_merge_keys_args(keys, d2t)
    ids, values = torch.ops.localargmax.merge_keys.default(keys, d2t)
    return ids, values


MAX_TOPK = 64
"""Largest k of :func:`shard_topk`."""


def check_topk_arg(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)) or not 1 <= k <= MAX_TOPK:
        raise ValueError(f"k must be an int in [1, {MAX_TOPK}], got {k!r}")


def check_sample_args(hidden, temperature, seed, offset) -> None:
    _check_tensor("temperature", temperature, f"[batch={hidden.shape[0]}] float32")
    if temperature.dim() != 1 or temperature.shape[0] != hidden.shape[0]:
        raise ValueError(f"temperature must be 1-D [batch={hidden.shape[0]}], got shape {tuple(temperature.shape)}")
    if temperature.dtype != torch.float32:
        raise TypeError(f"temperature must be float32, got {temperature.dtype}")
    if temperature.device != hidden.device:
        raise ValueError(f"temperature is on {temperature.device} but hidden is on {hidden.device}")
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or not 0 <= value < 2**63:
            raise ValueError(f"{name} must be an int in [0, 2**63), got {value!r}")


def shard_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The shard's ``k`` best entries per row, as packed keys, fused like
    :func:`shard_argmax` (the logits are never materialized).

    Args:
        hidden, weight, vocab_start, num_valid, bias: as in :func:`shard_argmax`.
        k: ``1 <= k <= 64``.

    Returns:
        ``[B, k]`` int64 packed keys, sorted descending (unsigned), i.e. in
        ``torch.topk(logits, k, sorted=True)`` order with ties to the smaller
        index; slots past the shard's ``num_valid`` entries hold key 0.

    Raises:
        TypeError / ValueError as :func:`shard_argmax`, and for ``k`` outside ``[1, 64]``.
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_topk_arg(k)
    return torch.ops.localargmax.shard_topk.default(hidden, weight, bias, vocab_start, num_valid, k)


def shard_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    temperature: torch.Tensor,
    seed: int,
    offset: int = 0,
    *,
    vocab_start: int = 0,
    num_valid: Optional[int] = None,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Gumbel-max sampling over one shard, fused like :func:`shard_argmax`.

    Each row's key is the best Gumbel-max score ``logit[b, v] / T[b] + g`` over
    the shard (computed as ``logit + T·g`` for ``T < 1``, which has the same
    argmax and cannot overflow: ``gumbel_score`` in csrc/common/philox.h, one
    function for every kernel), with ``g = g(seed, offset + b, v)`` standard
    Gumbel noise from Philox 4x32-10 keyed by the *global* vocabulary index
    ``v``, so the merged sample is the same for every TP size and shard
    layout. Rows with ``T == 0`` are greedy (no noise).

    Args:
        hidden, weight, vocab_start, num_valid, bias: as in :func:`shard_argmax`.
        temperature: ``[B]`` float32 on the device of ``hidden``, finite and ``>= 0``.
        seed: Philox key, ``0 <= seed < 2**63``.
        offset: Philox subsequence of row 0 (row ``b`` uses ``offset + b``);
            advance it by ``B`` every step for fresh noise.

    Returns:
        ``[B]`` int64 packed keys (their values are the perturbed scores).

    Raises:
        TypeError / ValueError as :func:`shard_argmax`, and for a malformed
        ``temperature``, ``seed`` or ``offset``. A NaN, negative or infinite
        temperature value: ValueError on CPU (read by the kernel, so eager and
        torch.compile alike); on CUDA that row's key is 0 ("no valid entry"),
        which the ``lm_head_*`` steps turn into an error.
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_sample_args(hidden, temperature, seed, offset)
    return torch.ops.localargmax.shard_sample.default(hidden, weight, bias, vocab_start, num_valid, temperature,
                                                      seed, offset)


def decode_keys(keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decode packed keys of any shape into ``(global_index, value)``.

    Args:
        keys: int64 packed keys, any shape, CPU or CUDA.

    Returns:
        ``(ids, values)`` of the same shape: int64 global indices and the exact
        float32 values (every NaN decodes to the canonical quiet NaN).

    Raises:
        TypeError if ``keys`` is not int64; on CPU ValueError for key 0 ("no
        valid entry"), which has no index (CUDA gives -1 / NaN there).
    """
    _check_tensor("keys", keys, "int64 packed keys")
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must be int64 packed keys, got {keys.dtype}")
    ids, values = torch.ops.localargmax.merge_keys.default(keys.reshape(1, -1), None)
    return ids.reshape(keys.shape), values.reshape(keys.shape)


@torch.library.register_fake("localargmax::shard_argmax")
def _shard_argmax_fake(hidden, weight, bias, vocab_start, num_valid):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64)


@torch.library.register_fake("localargmax::shard_topk")
def _shard_topk_fake(hidden, weight, bias, vocab_start, num_valid, k):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_topk_arg(k)
    return hidden.new_empty((hidden.shape[0], k), dtype=torch.int64)


@torch.library.register_fake("localargmax::shard_sample")
def _shard_sample_fake(hidden, weight, bias, vocab_start, num_valid, temperature, seed, offset):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_sample_args(hidden, temperature, seed, offset)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64)


@torch.library.register_fake("localargmax::merge_keys")
def _merge_keys_fake(keys, d2t):
    check_merge_keys_args(keys, d2t)
    batch = keys.shape[-1]
    return keys.new_empty((batch,), dtype=torch.int64), keys.new_empty((batch,), dtype=torch.float32)
