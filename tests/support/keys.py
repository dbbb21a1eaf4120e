"""An independent Python model of the packed key (DESIGN.md, "The packed key").

Nothing here calls the library: the tests compare the ops' keys with this model.
"""

from __future__ import annotations

import math
import struct

import torch

U32 = 0xFFFFFFFF
SIGN_BIT = -(2**63)
CANONICAL_NAN_BITS = 0x7FC00000


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u))[0]


def ordered(x: float) -> int:
    """The uint32 that sorts like the float32 ``x`` (-0.0 as +0.0, every NaN on top)."""
    if math.isnan(x):
        return U32
    u = f32_bits(x)
    if u == 0x80000000:
        u = 0
    return (u ^ U32) if (u & 0x80000000) else (u | 0x80000000)


def pack_key(value: float, index: int) -> int:
    """Unsigned 64-bit key of (value, global index)."""
    assert 0 <= index <= 0xFFFFFFFE
    return (ordered(value) << 32) | (U32 - index)


def unpack_key(u: int) -> tuple[int, float]:
    """(global index, float32 value) of an unsigned key: the format inverted."""
    o, low = u >> 32, u & U32
    bits = (o & 0x7FFFFFFF) if (o & 0x80000000) else (o ^ U32)
    return U32 - low, bits_f32(bits)


def decoded_bits(value: float) -> int:
    """The float32 bits decoding must give back: -0.0 as +0.0, NaN canonical."""
    if math.isnan(value):
        return CANONICAL_NAN_BITS
    bits = f32_bits(value)
    return 0 if bits == 0x80000000 else bits


def value_bits(values: torch.Tensor) -> list[int]:
    """The float32 bits of ``values`` as unsigned ints."""
    return [v & U32 for v in values.contiguous().view(torch.int32).flatten().tolist()]


def to_int64(u: int) -> int:
    """The int64 holding the bits of the uint64 ``u`` (what the ops return)."""
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >= (1 << 63) else u


def to_uint64(s: int) -> int:
    return s & ((1 << 64) - 1)


def same_float32(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality of two float32 tensors (NaN == NaN with equal bits)."""
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def allreduce_max(keys: torch.Tensor) -> torch.Tensor:
    """What an all-reduce MAX of sign-flipped keys computes: ``[1, B]``."""
    return ((keys ^ SIGN_BIT).max(dim=0).values ^ SIGN_BIT).unsqueeze(0)


def unsigned_max(keys: torch.Tensor) -> torch.Tensor:
    """The same as plain Python unsigned 64-bit integers (independent of torch): ``[1, B]``."""
    cols = keys.t().tolist()
    return torch.tensor([[to_int64(max(to_uint64(k) for k in col)) for col in cols]], dtype=torch.int64).view(1, -1)
