"""The sampling steps' noise, both kinds, as pure functions of their inputs:

- the tp-invariant Philox noise of ``shard_sample`` / :func:`lm_head_sample`
  (:func:`gumbel_noise`: Philox 4x32-10 at counter ``(id, row)``, DESIGN.md,
  "Sampling");
- vLLM 0.34's noise (DESIGN.md, "vLLM's noise"): vLLM's ``gumbel_sample``
  (``vllm/v1/worker/gpu/sample/gumbel.py``) draws it as a pure function of
  (request seed, position, global token id): ``murmur3_hash32`` ->
  ``murmur3_uniform32`` -> ``g = -log(-log1p(-u))`` (a degree-8 series below
  ``u = 0.25``), and samples ``argmax_v fl(x_v / T) + g`` in float32. Passing
  ``noise=vllm_noise(seed, pos)`` to :func:`localargmax.lm_head_sample` or
  :func:`localargmax.shard_sample` makes the fused kernels use that noise and
  score, so the sample is the one vLLM draws from the full logits (bit for bit
  up to the float32 ``log`` and division of the platform: DESIGN.md says where
  they can differ). With the filtered sampler's top-k / top-p / min-p: that
  score over the allowed set, ties to the smaller id.
"""

from __future__ import annotations

import math

import torch

from .._validation import VllmNoise, check_seed_offset, int64_rows

DRAFT_SALT = 1 << 30
"""vLLM's ``_DRAFT_NOISE_SALT``: added to the position when drafting (``is_drafting=True``)."""

UNIFORM64_DOMAIN = 0x9E3779B9
"""The second hash's domain of vLLM's ``murmur3_uniform64`` (``use_fp64_gumbel``)."""

_MASK32 = 0xFFFFFFFF

_M0, _M1, _W0, _W1, _MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
G_MAX = -math.log(-math.log((2.0**32 - 0.5) / 2.0**32))
"""The largest Gumbel noise the 32-bit Philox word can give (u = (2**32 - 0.5) / 2**32): about 22.87 (33 ln 2)."""
G_BOUND = G_MAX + 1e-5
"""Above every float32 noise value (``float32(G_MAX)`` is within 1e-6 of it)."""


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
    seed = int64_rows(seed, "seed")
    pos = int64_rows(pos, "pos", seed)
    if not isinstance(drafting, bool):
        raise ValueError(f"drafting must be a bool, got {drafting!r}")
    if drafting:
        pos = pos + DRAFT_SALT
    if spec_step is not None:
        if isinstance(spec_step, bool) or not isinstance(spec_step, (int, torch.Tensor)):
            raise ValueError(f"spec_step must be an int or an int64 tensor [B], got {spec_step!r}")
        if isinstance(spec_step, torch.Tensor):
            spec_step = int64_rows(spec_step, "spec_step", seed)
            low, high = (spec_step.min().item(), spec_step.max().item()) if spec_step.numel() else (0, 0)
        else:
            low = high = spec_step
        if low < 0 or high >= 1 << 31:
            bad = low if low < 0 else high
            raise ValueError(f"spec_step must be in [0, 2**31) (vLLM's speculative step), got {bad}")
        seed = seed ^ (torch.as_tensor(spec_step, dtype=torch.int64, device=seed.device) << 32)
    return VllmNoise(seed, pos)


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


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * b`` for ``a`` and ``b`` in [0, 2**32),
    from 16-bit halves of ``a`` so no int64 product overflows (9 tensor ops,
    in place where a temporary allows)."""
    p_lo, p_hi = b * (a & 0xFFFF), b * (a >> 16)  # < 2**48 each
    hi = (p_lo >> 16).add_(p_hi).bitwise_right_shift_(16)
    lo = (p_hi & 0xFFFF).bitwise_left_shift_(16).add_(p_lo).bitwise_and_(_MASK)
    return hi, lo


def _philox(seed: int, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Philox 4x32-10's first output word at counter ``(id, row)``, key ``seed`` (int64, < 2**32)."""
    c0, c1, c2, c3 = ids & _MASK, ids >> 32, rows & _MASK, (rows >> 32) & _MASK  # rows: uint64 bits
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    for _ in range(9):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1.bitwise_xor_(c1).bitwise_xor_(k0), lo1, hi0.bitwise_xor_(c3).bitwise_xor_(k1), lo0
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return _mulhilo(_M1, c2)[0].bitwise_xor_(c1).bitwise_xor_(k0)  # round 10: only x0 is used


def gumbel_noise(seed: int, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise of the sampling kernels at any (row, global id):
    Philox 4x32-10 with key ``seed`` and counter ``(id, row)``, ``u = (x0 +
    0.5) / 2**32``, ``g = float32(-log(-log(u)))`` (``gumbel_noise`` in
    csrc/common/philox.h). On the CPU the op ``localargmax::gumbel_noise``
    runs that function itself; on other devices it is evaluated in int64
    tensor arithmetic (one graph under torch.compile).

    Args:
        seed: int, ``0 <= seed < 2**63``.
        rows: int64 Philox subsequences ``offset + b``, read as uint64 (the
            kernels' ``offset + b`` past ``2**63 - 1`` is the int64 that
            wraps to negative), broadcastable with ``ids``.
        ids: int64 global (draft) vocabulary ids ``>= 0``, on the device of ``rows``.

    Returns:
        float32 noise of the broadcast shape, on their device. On the CPU
        bit-identical to the kernels'; elsewhere too, but where ``log`` of
        float64 differs by an ulp across libraries and that ulp crosses a
        float32 rounding boundary (about 2**-28 of values).

    Raises:
        ValueError: a seed out of range, shapes that do not broadcast,
            tensors on two devices; on the CPU a negative id.
        TypeError: rows or ids not int64.
    """
    check_seed_offset(seed, 0)
    if not isinstance(rows, torch.Tensor) or not isinstance(ids, torch.Tensor):
        raise TypeError(f"rows and ids must be int64 tensors, got {type(rows).__name__} and {type(ids).__name__}")
    if rows.dtype != torch.int64 or ids.dtype != torch.int64:
        raise TypeError(f"rows and ids must be int64, got {rows.dtype} and {ids.dtype}")
    if rows.device != ids.device:
        raise ValueError(f"rows and ids must be on one device, got {rows.device} and {ids.device}")
    try:
        rows, ids = torch.broadcast_tensors(rows, ids)
    except RuntimeError as e:
        raise ValueError(f"rows {tuple(rows.shape)} and ids {tuple(ids.shape)} must broadcast: {e}") from None
    if rows.device.type == "cpu":
        return torch.ops.localargmax.gumbel_noise(seed, rows.contiguous(), ids.contiguous())
    return _gumbel(_philox(seed, rows, ids))


def _gumbel(x0: torch.Tensor) -> torch.Tensor:
    """float32(-log(-log((x0 + 0.5) / 2**32))) of the int64 Philox words ``x0``, in float64."""
    u = x0.to(torch.float64).add_(0.5).mul_(1.0 / 2.0**32)
    return u.log_().neg_().log_().neg_().to(torch.float32)
