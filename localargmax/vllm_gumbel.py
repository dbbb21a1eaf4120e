"""vLLM 0.34's Gumbel noise for the sampling ops (DESIGN.md, "vLLM's noise").

vLLM's ``gumbel_sample`` (``vllm/v1/worker/gpu/sample/gumbel.py``) draws its
noise as a pure function of (request seed, position, global token id):
``murmur3_hash32`` -> ``murmur3_uniform32`` -> ``g = -log(-log1p(-u))`` (a
degree-8 series below ``u = 0.25``), and samples ``argmax_v fl(x_v / T) + g``
in float32. Passing ``noise=vllm_noise(seed, pos)`` to
:func:`localargmax.lm_head_sample` or :func:`localargmax.shard_sample` makes
the fused kernels use that noise and score instead
of the tp-invariant Philox noise, so the sample is the one vLLM draws from
the full logits (bit for bit up to the float32 ``log`` and division of the
platform: DESIGN.md says where they can differ). With the filtered sampler's
top-k / top-p / min-p: that score over the allowed set, ties to the smaller id.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

DRAFT_SALT = 1 << 30
"""vLLM's ``_DRAFT_NOISE_SALT``: added to the position when drafting (``is_drafting=True``)."""

UNIFORM64_DOMAIN = 0x9E3779B9
"""The second hash's domain of vLLM's ``murmur3_uniform64`` (``use_fp64_gumbel``)."""

_MASK32 = 0xFFFFFFFF


class VllmNoise(NamedTuple):
    """vLLM's noise for a batch: per row the hash's seed and position, as
    vLLM's kernel hashes them (the draft salt and the speculative step
    already folded in; build it with :func:`vllm_noise`).

    Attributes:
        seed: ``[B]`` int64, vLLM's ``seeds[req_state_idx]`` (mixed with
            the speculative step where vLLM mixes it).
        pos: ``[B]`` int64, vLLM's ``pos`` (plus ``DRAFT_SALT`` when
            drafting). Only its low 32 bits enter the hash, as in vLLM.
    """

    seed: torch.Tensor
    pos: torch.Tensor


def _int64_rows(value, name: str, like: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be an int64 tensor [B], got {type(value).__name__}")
    if value.dtype != torch.int64:
        raise ValueError(f"{name} must be int64, got {value.dtype}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(value.shape)}")
    if like is not None:
        if value.shape != like.shape:
            raise ValueError(f"{name} must have the seed's shape {tuple(like.shape)}, got {tuple(value.shape)}")
        if value.device != like.device:
            raise ValueError(f"{name} is on {value.device} but seed is on {like.device}")
    return value


def vllm_noise(seed: torch.Tensor, pos: torch.Tensor, *, drafting: bool = False, spec_step=None) -> VllmNoise:
    """The :class:`VllmNoise` of a batch, as vLLM's ``gumbel_block_argmax``
    forms the hash's inputs.

    Args:
        seed: ``[B]`` int64 per-row request seeds (vLLM's
            ``sampling_states.seeds[idx_mapping]``; any int64, the hash
            reads all 64 bits).
        pos: ``[B]`` int64 positions (vLLM's ``pos`` /
            ``sample_src_positions``), same shape and device as ``seed``.
        drafting: vLLM's ``is_drafting``: ``pos + DRAFT_SALT``.
        spec_step: vLLM's ``logits_cache_col`` when drafting into the
            draft-logits cache: ``seed ^ (spec_step << 32)``
            (``spec_step_seed``); an int or a ``[B]`` int64 tensor, each in
            ``[0, 2**31)`` (a tensor's values are read: one device sync);
            None: the seed as is.

    Returns:
        ``VllmNoise(seed, pos)``, ``[B]`` int64 each, on ``seed``'s device.

    Raises:
        ValueError: ``seed`` / ``pos`` / ``spec_step`` not int64 ``[B]``
            tensors of one shape and device (naming the argument), a
            ``spec_step`` outside ``[0, 2**31)`` (vLLM's steps count
            speculative tokens; a negative or larger one would wrap the
            shifted seed silently), or ``drafting`` not a bool.
    """
    seed = _int64_rows(seed, "seed")
    pos = _int64_rows(pos, "pos", seed)
    if not isinstance(drafting, bool):
        raise ValueError(f"drafting must be a bool, got {drafting!r}")
    if drafting:
        pos = pos + DRAFT_SALT
    if spec_step is not None:
        if isinstance(spec_step, bool) or not isinstance(spec_step, (int, torch.Tensor)):
            raise ValueError(f"spec_step must be an int or an int64 tensor [B], got {spec_step!r}")
        if isinstance(spec_step, torch.Tensor):
            spec_step = _int64_rows(spec_step, "spec_step", seed)
            low, high = (spec_step.min().item(), spec_step.max().item()) if spec_step.numel() else (0, 0)
        else:
            low = high = spec_step
        if low < 0 or high >= 1 << 31:
            bad = low if low < 0 else high
            raise ValueError(f"spec_step must be in [0, 2**31) (vLLM's speculative step), got {bad}")
        seed = seed ^ (torch.as_tensor(spec_step, dtype=torch.int64, device=seed.device) << 32)
    return VllmNoise(seed, pos)


def check_noise(noise, hidden: torch.Tensor) -> VllmNoise:
    """``noise`` for a batch of ``hidden``'s rows: a :class:`VllmNoise` of
    ``[B]`` int64 tensors on ``hidden``'s device (ValueError naming the
    field otherwise)."""
    if not isinstance(noise, VllmNoise):
        raise ValueError(f"noise must be None or a VllmNoise (localargmax.vllm_noise(seed, pos)), got {noise!r}")
    batch = hidden.shape[0]
    for name, t in (("noise.seed", noise.seed), ("noise.pos", noise.pos)):
        _int64_rows(t, name)
        if t.shape[0] != batch:
            raise ValueError(f"{name} must be [B={batch}], got shape {tuple(t.shape)}")
        if t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device} but hidden is on {hidden.device}")
    return noise


def vllm_gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor, *, fp64: bool = False) -> torch.Tensor:
    """vLLM 0.34's Gumbel noise at (seed, pos, global token id), elementwise.

    float32 (default): ``-log(-_log1p_neg_stable(murmur3_uniform32(seed, pos,
    id)))``, the noise of vLLM's default sampler and of the kernels'
    ``noise=vllm_noise(...)`` (csrc/common/vllm_noise.h). ``fp64``: vLLM's
    ``use_fp64_gumbel`` noise, ``-log(-log(murmur3_uniform64(...)))`` in
    float64 (the fused ops do not sample with it: their float32 keys cannot
    order float64 scores).

    Args:
        seed, pos: int64 hash inputs as :class:`VllmNoise` holds them (salt and
            speculative step folded in); only ``pos``'s low 32 bits are hashed.
        ids: int64 global token ids ``>= 0`` (hashed as uint32, as vLLM does).
            The three broadcast together and share a device.

    Returns:
        float32 (``fp64``: float64) noise of the broadcast shape on their
        device. On the CPU the C++ op (the kernels' function); elsewhere int64
        tensor arithmetic with the same float operations (the ``log``, a
        library's, can differ from the kernels' by an ulp).

    Raises:
        ValueError: a non-int64 input (naming it), shapes that do not
            broadcast, two devices; on the CPU a negative id.
    """
    for name, t in (("seed", seed), ("pos", pos), ("ids", ids)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
            raise ValueError(f"{name} must be an int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.device != ids.device:
            raise ValueError(f"{name} is on {t.device} but ids are on {ids.device}")
    try:
        seed, pos, ids = torch.broadcast_tensors(seed, pos, ids)
    except RuntimeError as e:
        raise ValueError(f"seed, pos and ids must broadcast: {e}") from None
    if ids.device.type == "cpu":
        return torch.ops.localargmax.vllm_gumbel_noise(seed.contiguous(), pos.contiguous(), ids.contiguous(), fp64)
    if fp64:
        lo = murmur3_hash32(seed, pos, ids)
        hi = murmur3_hash32(seed, pos, ids, UNIFORM64_DOMAIN)
        r53 = (hi << 21) | (lo >> 11)  # ((hi << 32) | lo) >> 11 without leaving int64
        u = (r53.to(torch.float64) + 0.5) * 2.0**-53
        u = torch.where(u == 1.0, u - 2.0**-53, u)
        return -torch.log(-torch.log(u))
    return torch_gumbel32(murmur3_hash32(seed, pos, ids))


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """``a * c mod 2**32`` for ``a`` in ``[0, 2**32)``, from 16-bit halves of ``c`` (no int64 overflow)."""
    return ((a * (c & 0xFFFF)) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _rotl(a: torch.Tensor, s: int) -> torch.Tensor:
    return ((a << s) | (a >> (32 - s))) & _MASK32


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _mul32(_rotl(_mul32(key, 0xCC9E2D51), 15), 0x1B873593)
    return (_mul32(_rotl(h ^ key, 13), 5) + 0xE6546B64) & _MASK32


def murmur3_hash32(seed: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor, domain: int = 0) -> torch.Tensor:
    """vLLM's ``murmur3_hash32(seed, pos, id, domain)`` in int64 tensor
    arithmetic (values in ``[0, 2**32)``), for broadcast int64 tensors."""
    h = torch.full_like(ids, domain)
    h = _mix(h, seed & _MASK32)
    h = _mix(h, (seed >> 32) & _MASK32)
    h = _mix(h, pos & _MASK32)
    h = _mix(h, ids & _MASK32) ^ 16
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


_SERIES = [float(torch.tensor(1.0 / n, dtype=torch.float32)) for n in (7, 6, 5, 4, 3, 2)]


def torch_gumbel32(r: torch.Tensor) -> torch.Tensor:
    """vLLM's float32 noise of the 32-bit hashes ``r`` (int64 in ``[0,
    2**32)``): ``murmur3_uniform32``, ``_log1p_neg_stable``, ``-log(-.)``, each
    step a float32 tensor operation in vLLM's order."""
    f32 = torch.float32
    u = (r >> 16).to(f32) * 2.0**-16 + ((r & 0xFFFF).to(f32) + 0.5) * 2.0**-32
    p = torch.full_like(u, 0.125)
    for c in _SERIES:
        p = c + u * p
    p = 1.0 + u * p
    series = -u * p
    direct = torch.log(torch.clamp(1.0 - u, min=5.960464477539063e-08))
    return -torch.log(-torch.where(u < 0.25, series, direct))
