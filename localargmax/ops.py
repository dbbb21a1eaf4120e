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

import torch

from . import _ext, dispatch  # noqa: F401  (_ext loads the library: registers torch.ops.localargmax)
from ._validation import (
    MAX_TOPK,
    VllmNoise,
    _check_tensor,
    check_merge_keys_args,
    check_noise,
    check_op_transform_args,
    check_sample_args,
    check_shard_argmax_args,
    check_temperature_arg,
    check_topk_arg,
    check_transform_args,
    mma_config_path,
)
from .packed_key import MAX_GLOBAL_INDEX

__all__ = ["MAX_GLOBAL_INDEX", "MAX_TOPK", "decode_keys", "merge_keys", "shard_argmax", "shard_sample", "shard_topk"]


def shard_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    path: str = "auto",
    log_partition: bool = False,
    scale: float = 1.0,
    soft_cap: float | None = None,
    temperature: torch.Tensor | None = None,
    _mma_config: str | None = None,
):
    """Fused ``hidden @ weight.T (+ bias)`` and row-wise argmax over one vocab
    shard, as one packed int64 key per row (DESIGN.md, "The packed key"); the
    logits are never stored. Products accumulate in float32.

    Example::

        keys = shard_argmax(hidden, weight, vocab_start=shard.vocab_start, num_valid=shard.num_valid)
        ids, values = decode_keys(keys)  # global ids, exact float32 logits

    Args:
        hidden: ``[B, H]`` float32, bfloat16 or float16, on CPU or CUDA.
        weight: ``[rows, H]`` this rank's shard, ``hidden``'s dtype and device,
            rows contiguous (``stride(1) == 1``).
        vocab_start: global vocabulary index of row 0 (>= 0).
        num_valid: rows ``[0, num_valid)`` are vocabulary; the rest is padding
            and never wins. Default: all rows.
        bias: ``[rows]`` float32 or weight-dtype bias, or None.
        path: the kernel: ``"auto"`` (default); on CPU ``"avx512"``, ``"avx2"``
            or ``"generic"`` (bit-identical; auto takes the first the CPU has),
            ``"avx512_bf16"`` (bf16 through vdpbf16ps: other bits; auto takes it
            for bf16 on AVX-512-BF16 CPUs without AMX) or
            ``"brgemm"`` (ATen's oneDNN brgemm: other bits; auto takes it for
            bf16 / fp16 on AMX) (DESIGN.md "CPU paths"; a path the CPU lacks
            is a ValueError naming the missing features); on CUDA ``"mma"`` (tensor cores; bf16 /
            fp16, ``H`` and row strides multiples of 8), ``"gemm"`` (cuBLAS logits, then keys) or ``"simt"``
            (CUDA cores, every dtype). CUDA ``"auto"`` is C++'s choice, or a
            measured dispatch table's (:mod:`localargmax.dispatch`). The CUDA
            paths differ only in the float32 summation order (docs/kernels.md).
        log_partition: also return each row's log-partition pair (DESIGN.md,
            "Log-probabilities"), from the same pass; the logits are first
            soft-capped (``tanh(x / soft_cap) * soft_cap``) then scaled
            (``x * scale``), and the keys carry the transformed values. Every
            path computes it (CUDA: not a forced TMA ``_mma_config``).
        scale: finite float ``>= 2**-126``, with ``log_partition`` only (the op
            schema's name, as vLLM's ``LogitsProcessor(scale=...)``; the
            steps call it ``logit_scale``: DESIGN.md, "Log-probabilities").
        soft_cap: None or a finite float ``>= 2**-126``, with ``log_partition`` only.
        temperature: None (``T = 1``) or a ``[B]`` float32 tensor on
            ``hidden``'s device, with ``log_partition`` only: row ``b``'s sum
            is over ``exp((x - ref) / T_b)`` (the log-odds at a request's
            temperature); rows with ``T <= 0`` use 1. The keys stay the argmax.

    Returns:
        ``[B]`` int64 keys (0 for every row when ``num_valid == 0``); with
        ``log_partition``, ``(keys, pairs)``: ``pairs`` ``[B, 2]`` float32
        ``(ref, others)``, ``ref`` the key's value (``-inf`` for an empty
        shard) and ``others = Σ exp((x - ref) / T)`` over the valid entries
        other than the best one, so ``ref + log1p(others)`` is the shard's
        ``logsumexp`` (``ref`` finite) and ``-log(others)`` the best entry's
        log-odds within the shard.

    Raises:
        TypeError / ValueError: naming the argument, for wrong ranks, shapes,
            dtypes, devices, non-contiguous weight rows, ``num_valid`` outside
            ``[0, rows]``, ``vocab_start < 0``, global indices past 2**32 - 2,
            an unknown ``path`` or one that cannot take the inputs (never a
            silent fallback).
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    path = mma_config_path(path, _mma_config, weight.device)  # (the private keyword: one config, by name)
    wants_partition = _wants_partition(log_partition, scale, soft_cap)
    path = _auto_path(path, hidden, weight)  # (the _lse op too: the same path and config as the plain one)
    if wants_partition:
        return torch.ops.localargmax.shard_argmax_lse.default(
            hidden, weight, bias, vocab_start, num_valid, float(scale), float(soft_cap or 0.0), path, temperature
        )
    if temperature is not None:
        raise ValueError(
            "temperature is the log-partition's (the log-odds at a request's temperature): pass log_partition=True "
            "(the argmax does not depend on it)"
        )
    return torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, vocab_start, num_valid, path)


def _wants_partition(log_partition, scale, soft_cap, samples: bool = False) -> bool:
    """Checks the log-partition keywords; whether the *_lse op runs. A scale
    or soft-cap without ``log_partition`` is refused for the argmax and top-k
    (it cannot change their ids) and taken for sampling (``samples``: it
    changes the sampled ids)."""
    if not isinstance(log_partition, bool):
        raise TypeError(f"log_partition must be a bool, got {type(log_partition).__name__}")
    check_transform_args(scale, soft_cap)
    if not (log_partition or samples) and (scale != 1.0 or soft_cap is not None):
        raise ValueError(
            f"scale={scale!r} and soft_cap={soft_cap!r} transform the logits for the log-partition only: "
            "pass log_partition=True (they do not change the argmax)"
        )
    return log_partition


def merge_keys(keys: torch.Tensor, d2t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the ranks' packed keys, decode, and map draft ids to target ids.

    Example::

        ids, values = merge_keys(torch.stack(keys_of_every_rank))  # [tp, B] -> [B], [B]

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


def shard_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    path: str = "auto",
    log_partition: bool = False,
    scale: float = 1.0,
    soft_cap: float | None = None,
    _mma_config: str | None = None,
):
    """The shard's ``k`` best entries per row, as packed keys, fused like
    :func:`shard_argmax` (the logits are never materialized).

    Example::

        keys = shard_topk(hidden, weight, 8, vocab_start=shard.vocab_start, num_valid=shard.num_valid)
        ids, values = decode_keys(keys)  # [B, 8] each, best first

    Args:
        hidden, weight, vocab_start, num_valid, bias: as in :func:`shard_argmax`.
        k: ``1 <= k <= 64``.
        path: ``"auto"``, CPU ``"generic"`` / ``"avx2"`` / ``"avx512"`` /
            ``"avx512_bf16"`` / ``"brgemm"``, CUDA ``"simt"`` or ``"mma"``
            (top-k has no gemm path; CUDA ``auto`` runs ``"mma"`` for bf16 /
            fp16 where the tensor-core kernel takes the inputs, else ``"simt"``).
        log_partition, scale, soft_cap: as in :func:`shard_argmax`.

    Returns:
        ``[B, k]`` int64 packed keys, sorted descending (unsigned), i.e. in
        ``torch.topk(logits, k, sorted=True)`` order with ties to the smaller
        index; slots past the shard's ``num_valid`` entries hold key 0. With
        ``log_partition``: ``(keys, pairs [B, 2] float32)``, the pair as in
        :func:`shard_argmax` (``ref`` is the value of ``keys[:, 0]``).

    Raises:
        TypeError / ValueError as :func:`shard_argmax`, for ``k`` outside ``[1, 64]``, for ``path="gemm"``
            and for a tensor-core config without top-k (``_mma_config``: ``n8_r256``, ``n8_r192``, the ``_tma`` ones).
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_topk_arg(k)
    path = mma_config_path(path, _mma_config, weight.device)  # (the private keyword: one config, by name)
    if _wants_partition(log_partition, scale, soft_cap):
        return torch.ops.localargmax.shard_topk_lse.default(
            hidden, weight, bias, vocab_start, num_valid, k, float(scale), float(soft_cap or 0.0), path
        )
    return torch.ops.localargmax.shard_topk.default(hidden, weight, bias, vocab_start, num_valid, k, path)


def shard_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    temperature: torch.Tensor,
    seed: int,
    offset: int = 0,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    path: str = "auto",
    log_partition: bool = False,
    scale: float = 1.0,
    soft_cap: float | None = None,
    noise=None,
    _mma_config: str | None = None,
):
    """Gumbel-max sampling over one shard, fused like :func:`shard_argmax`.

    Each row's key is the best Gumbel-max score ``logit[b, v] / T[b] + g`` over
    the shard (computed as ``logit + T·g`` for ``T < 1``, which has the same
    argmax and cannot overflow: ``gumbel_score`` in csrc/common/philox.h, one
    function for every kernel), with ``g = g(seed, offset + b, v)`` standard
    Gumbel noise from Philox 4x32-10 keyed by the *global* vocabulary index
    ``v``, so the merged sample is the same for every TP size and shard
    layout. Rows with ``T == 0`` are greedy (no noise).

    Example::

        t = torch.full((hidden.shape[0],), 0.7, device=hidden.device)
        keys = shard_sample(hidden, weight, t, seed=1234, offset=step * hidden.shape[0])

    Args:
        hidden, weight, vocab_start, num_valid, bias: as in :func:`shard_argmax`.
        temperature: ``[B]`` float32 on the device of ``hidden``, finite and ``>= 0``.
        seed: Philox key, ``0 <= seed < 2**63``.
        offset: Philox subsequence of row 0 (row ``b`` uses ``offset + b``);
            advance it by ``B`` every step for fresh noise.
        path: as in :func:`shard_argmax`.
        log_partition, scale, soft_cap: as in :func:`shard_argmax`, but a
            scale or soft-cap is taken without ``log_partition`` too: the
            Gumbel-max scores are those of the transformed logits either way.
        noise: None (the Philox noise above), or a
            :class:`localargmax.VllmNoise` (``localargmax.vllm_noise(seed,
            pos, ...)``, ``[B]`` int64 tensors on ``hidden``'s device): vLLM
            0.34's noise ``g(noise.seed[b], noise.pos[b], v)`` and score
            ``fl(x / T) + g`` (``seed`` and ``offset`` are then unused;
            DESIGN.md, "vLLM's noise"). On CUDA it runs on the ``"gemm"``
            path alone (bfloat16 / float16 weights; ``"auto"`` takes it).

    Returns:
        ``[B]`` int64 packed keys (their values are the perturbed scores).
        With ``log_partition``: ``(keys, pairs [B, 2] float32)``, ``ref`` the
        transformed logit of the row's sampled entry and ``others`` the sum of
        ``exp((x - ref) / T)`` over the shard's other entries (``T = 1`` for
        greedy rows), so that ``-log1p(others)`` is the sampled entry's
        log-probability within the shard under ``softmax(x / T)``.

    Raises:
        TypeError / ValueError as :func:`shard_argmax`, and for a malformed
        ``temperature``, ``seed``, ``offset`` or ``noise`` (on CUDA also for
        ``noise`` with a path other than ``"auto"`` / ``"gemm"`` or float32
        weights). A NaN, negative or infinite
        temperature value: ValueError on CPU (read by the kernel, so eager and
        torch.compile alike); on CUDA that row's key is 0 ("no valid entry"),
        which the ``lm_head_*`` steps turn into an error.
    """
    if num_valid is None:
        num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_sample_args(hidden, temperature, seed, offset)
    noise_args = () if noise is None else tuple(check_noise(noise, hidden))
    path = mma_config_path(path, _mma_config, weight.device)
    transformed = _wants_partition(log_partition, scale, soft_cap, samples=True) or scale != 1.0 or soft_cap is not None
    if noise is None:  # vLLM's noise: CUDA's "auto" is the gemm path (below)
        path = _auto_path(path, hidden, weight)
    if transformed:  # the transform runs in the log-partition op; without log_partition its pairs are dropped
        out = torch.ops.localargmax.shard_sample_lse.default(
            hidden,
            weight,
            bias,
            vocab_start,
            num_valid,
            temperature,
            seed,
            offset,
            float(scale),
            float(soft_cap or 0.0),
            path,
            *noise_args,
        )
        return out if log_partition else out[0]
    return torch.ops.localargmax.shard_sample.default(
        hidden, weight, bias, vocab_start, num_valid, temperature, seed, offset, path, *noise_args
    )


def _auto_path(path: str, hidden: torch.Tensor, weight: torch.Tensor) -> str:
    """``path``, with CUDA's ``"auto"`` resolved by a measured dispatch table if one is set."""
    if path != "auto" or weight.device.type != "cuda":
        return path
    return dispatch.cuda_path(hidden, weight)


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode packed keys of any shape into ``(global_index, value)``.

    Example::

        index, value = decode_keys(shard_argmax(hidden, weight))

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
def _shard_argmax_fake(hidden, weight, bias, vocab_start, num_valid, path="auto"):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64)


@torch.library.register_fake("localargmax::shard_topk")
def _shard_topk_fake(hidden, weight, bias, vocab_start, num_valid, k, path="auto"):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_topk_arg(k)
    return hidden.new_empty((hidden.shape[0], k), dtype=torch.int64)


@torch.library.register_fake("localargmax::shard_sample")
def _shard_sample_fake(
    hidden, weight, bias, vocab_start, num_valid, temperature, seed, offset, path="auto", noise_seed=None,
    noise_pos=None,
):  # fmt: skip
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_sample_args(hidden, temperature, seed, offset)
    _check_noise_tensors(hidden, noise_seed, noise_pos)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64)


@torch.library.register_fake("localargmax::merge_keys")
def _merge_keys_fake(keys, d2t):
    check_merge_keys_args(keys, d2t)
    batch = keys.shape[-1]
    return keys.new_empty((batch,), dtype=torch.int64), keys.new_empty((batch,), dtype=torch.float32)


@torch.library.register_fake("localargmax::gumbel_noise")
def _gumbel_noise_fake(seed, rows, ids):
    if rows.shape != ids.shape or rows.dtype != torch.int64 or ids.dtype != torch.int64:
        raise ValueError(f"gumbel_noise: rows and ids must be int64 of one shape, got {rows.shape}, {ids.shape}")
    if rows.device != ids.device:
        raise ValueError(f"gumbel_noise: rows and ids must be on one device, got {rows.device} and {ids.device}")
    return rows.new_empty(rows.shape, dtype=torch.float32)


@torch.library.register_fake("localargmax::vllm_gumbel_noise")
def _vllm_gumbel_noise_fake(seeds, pos, ids, fp64=False):
    for name, t in (("seeds", seeds), ("pos", pos), ("ids", ids)):
        if t.shape != ids.shape or t.dtype != torch.int64 or t.device != ids.device:
            raise ValueError(f"vllm_gumbel_noise: {name} must be int64 of ids' shape and device")
    return ids.new_empty(ids.shape, dtype=torch.float64 if fp64 else torch.float32)


def _check_noise_tensors(hidden, noise_seed, noise_pos):
    """The ops' noise_seed / noise_pos: both or neither (as csrc/checks.h's check_noise_args)."""
    if (noise_seed is None) != (noise_pos is None):
        raise ValueError("shard_sample: noise_seed and noise_pos come together (vLLM's noise)")
    if noise_seed is not None:
        check_noise(VllmNoise(noise_seed, noise_pos), hidden)


def _pairs_fake(hidden):
    return hidden.new_empty((hidden.shape[0], 2), dtype=torch.float32)


@torch.library.register_fake("localargmax::shard_argmax_lse")
def _shard_argmax_lse_fake(
    hidden, weight, bias, vocab_start, num_valid, scale=1.0, soft_cap=0.0, path="auto", temperature=None
):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_op_transform_args(scale, soft_cap)
    if temperature is not None:
        check_temperature_arg("shard_argmax", hidden, temperature)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64), _pairs_fake(hidden)


@torch.library.register_fake("localargmax::shard_topk_lse")
def _shard_topk_lse_fake(hidden, weight, bias, vocab_start, num_valid, k, scale=1.0, soft_cap=0.0, path="auto"):
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_topk_arg(k)
    check_op_transform_args(scale, soft_cap)
    return hidden.new_empty((hidden.shape[0], k), dtype=torch.int64), _pairs_fake(hidden)


@torch.library.register_fake("localargmax::shard_sample_lse")
def _shard_sample_lse_fake(
    hidden, weight, bias, vocab_start, num_valid, temperature, seed, offset, scale=1.0, soft_cap=0.0, path="auto",
    noise_seed=None, noise_pos=None,
):  # fmt: skip
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    check_sample_args(hidden, temperature, seed, offset)
    _check_noise_tensors(hidden, noise_seed, noise_pos)
    check_op_transform_args(scale, soft_cap)
    return hidden.new_empty((hidden.shape[0],), dtype=torch.int64), _pairs_fake(hidden)


@torch.library.register_fake("localargmax::step_frame")
def _step_frame_fake(
    hidden, weight, bias, vocab_start, num_valid, mode, k, temperature, seed, offset, scale, soft_cap, log_partition,
    send_pairs, sign_flip, path="auto", noise_seed=None, noise_pos=None,
):  # fmt: skip
    check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid)
    batch = hidden.shape[0]
    return hidden.new_empty((3 + batch * k + (batch if send_pairs else 0),), dtype=torch.int64)


@torch.library.register_fake("localargmax::merge_frames")
def _merge_frames_fake(
    frames, batch, k, pairs, mode, d2t, target_vocab, temperature, log_probs, log_odds, sign_flipped, raise_errors
):  # fmt: skip
    shape = (batch, k) if mode == 1 else (batch,)
    floats = {"dtype": torch.float32}
    return (
        frames.new_empty(shape),
        frames.new_empty(shape, **floats),
        frames.new_empty(shape if log_probs else (0,), **floats),
        frames.new_empty((batch if log_odds else 0,), **floats),
        frames.new_empty((), dtype=torch.bool),
    )


@torch.library.register_fake("localargmax::log_probs_from_pairs")
def _log_probs_from_pairs_fake(values, pairs, temperature):
    if values.dtype != torch.float32 or pairs.dtype != torch.float32:
        raise TypeError(f"log_probs_from_pairs: values and pairs must be float32, got {values.dtype} and {pairs.dtype}")
    if values.dim() not in (1, 2) or pairs.dim() != 3 or pairs.shape[1] != values.shape[0] or pairs.shape[2] != 2:
        raise ValueError(
            f"log_probs_from_pairs: values must be [B] or [B, k] and pairs [tp >= 1, B, 2], got shapes "
            f"{tuple(values.shape)} and {tuple(pairs.shape)}"
        )
    for name, t in (("pairs", pairs), ("temperature", temperature)):
        if t is not None and t.device != values.device:
            raise ValueError(
                f"log_probs_from_pairs: {name} must be on values' device ({values.device}), got {t.device}"
            )
    return values.new_empty(values.shape)


# Autograd: the ops are not differentiable (argmax, top-k and sampling have no
# useful gradient; the log-partition pairs are a forward-only by-product).
# Registered at the Autograd key so that torch does not fall back to passing
# gradients through silently: a backward through any output raises, naming the op.
FUSED_OPS = (
    "shard_argmax", "shard_topk", "shard_sample", "shard_argmax_lse", "shard_topk_lse", "shard_sample_lse",
    "merge_keys", "gumbel_noise", "vllm_gumbel_noise",
)  # fmt: skip

STEP_OPS = ("step_frame", "merge_frames", "log_probs_from_pairs")
"""The planned step's ops (localargmax/plan.py) and the log-probabilities of its merge for steps that merge in
Python (sampling.logprobs.log_probs_from_pairs): their autograd kernel is C++'s fallback (csrc/ops.cpp: a
backward raises "derivative for localargmax::<op> is not implemented"), no Python on every call."""


def _not_differentiable(name: str):
    def backward(ctx, *grads):
        raise RuntimeError(
            f"localargmax::{name} is not differentiable (DESIGN.md: the ops are autograd-free); "
            "detach its inputs, or compute a differentiable loss from the logits instead"
        )

    return backward


for _name in FUSED_OPS:
    torch.library.register_autograd(f"localargmax::{_name}", _not_differentiable(_name))
