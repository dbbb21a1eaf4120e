"""The packed key's constants on the Python side (DESIGN.md, "The packed key";
their C++ twins are in csrc/common/packed_key.h).

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


def key_index(keys: torch.Tensor) -> torch.Tensor:
    """Global vocabulary index of each int64 packed key (any shape, any device)."""
    return INDEX_MASK - (keys & INDEX_MASK)
