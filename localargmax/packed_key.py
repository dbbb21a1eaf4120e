"""The packed key on the Python side, its one definition there (DESIGN.md,
"The packed key"; the C++ one is csrc/common/packed_key.h): constants,
:func:`pack_keys` (encode), :func:`key_index`, :func:`top_keys`; the op
``decode_keys`` decodes.

    key = (ordered(value) << 32) | (0xFFFFFFFF - global_index)      (uint64)

held in an ``int64`` tensor. The unsigned maximum over keys is
``torch.argmax``'s answer; torch, NCCL and gloo compare int64 as signed, so
keys are XORed with :data:`SIGN_FLIP` before a signed max / top-k / all-reduce
and back after it (signed order of ``key ^ SIGN_FLIP`` == unsigned order of
``key``).
"""

from __future__ import annotations

import torch

MAX_GLOBAL_INDEX = 0xFFFFFFFE
"""Largest global vocabulary index a packed key can carry (2**32 - 2)."""

NO_ENTRY_KEY = 0
"""The key of "no valid entry" (padding only); decoding it is an error."""

INDEX_MASK = 0xFFFFFFFF
"""The low half of a key: ``INDEX_MASK - (key & INDEX_MASK)`` is its global index."""

SIGN_FLIP = -(2**63)
"""``key ^ SIGN_FLIP`` sorts as a signed int64 like ``key`` does unsigned."""

NO_ENTRY_STANDIN = 0x007FFFFFFFFFFFFF
"""A decodable key (``-inf`` at id 0) put in place of :data:`NO_ENTRY_KEY`
before ``decode_keys`` where the caller masks or never returns those rows."""


def key_index(keys: torch.Tensor) -> torch.Tensor:
    """Global vocabulary index of each int64 packed key (any shape, any device)."""
    return INDEX_MASK - (keys & INDEX_MASK)


def pack_keys(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Packed keys of float32 ``values`` at global ``ids`` (int64 ``<=
    MAX_GLOBAL_INDEX``), elementwise, as int64: the kernels' ``pack_key`` in
    tensor arithmetic (every NaN largest, -0.0 as +0.0)."""
    u = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = torch.where(u == 0x80000000, 0, u)
    ordered = torch.where(u >= 0x80000000, u ^ 0xFFFFFFFF, u | 0x80000000)
    ordered = torch.where(values.isnan(), 0xFFFFFFFF, ordered)
    high = torch.where(ordered >= 0x80000000, ordered - (1 << 32), ordered)  # as int32, so the shift stays in int64
    return (high << 32) | (0xFFFFFFFF - ids)


def top_keys(keys: torch.Tensor, m: int, dim: int = -1) -> torch.Tensor:
    """The ``m`` largest int64 packed keys along ``dim`` in the keys' unsigned
    order, largest first (a signed top-k on ``key ^ SIGN_FLIP``)."""
    return (keys ^ SIGN_FLIP).topk(m, dim=dim).values ^ SIGN_FLIP
