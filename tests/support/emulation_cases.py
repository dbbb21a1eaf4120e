"""What the emulation test files (tests/test_emulation*.py) share: the
exact-problem helpers whose keys the CPU kernel gives bit for bit, and the
variant tables (the module's emulator is the ``emu`` fixture of
tests/conftest.py)."""

from __future__ import annotations

import torch

import localargmax  # noqa: F401  (registers torch.ops.localargmax)
from localargmax._validation import MMA_CONFIGS

ops = torch.ops.localargmax
HALF = (torch.bfloat16, torch.float16)
ALL = (torch.float32, *HALF)


def shapes(text: str) -> list[tuple[int, int, int]]:
    """Problem shapes written ``"B x rows x H"`` apart by spaces: ``shapes("1x1x8 9x65x24")``."""
    return [tuple(int(n) for n in item.split("x")) for item in text.split()]


# Each path with each dtype it serves (gemm: one) and every tensor-core config
# forced (alternating bf16 / fp16).
EVERY_PATH_AND_CONFIG = [
    *[("simt", dtype) for dtype in ALL],
    *[("mma", dtype) for dtype in HALF],
    ("gemm", torch.float16),
    *[(f"mma/{name}", HALF[i % 2]) for i, name in enumerate(MMA_CONFIGS)],
]


# The paths that take top-k: simt, mma auto and every config with room for it (MmaConfig.topk).
TOPK_PATHS = [
    *[("simt", dtype) for dtype in ALL],
    *[("mma", dtype) for dtype in HALF],
    *[(f"mma/{name}", HALF[i % 2]) for i, name in enumerate(n for n, m in MMA_CONFIGS.items() if m.topk)],
]


def exact_problem(gen, batch, rows, hidden_size, dtype, bias=None, lo=-3, hi=3):
    """Small integers: every dot product (and bias sum) is exact in float32,
    so every accumulation order gives the same bits. bias: None, "f" (float32
    with a half weight) or "t" (the weight's dtype)."""
    h = torch.randint(lo, hi + 1, (batch, hidden_size), generator=gen).to(dtype)
    w = torch.randint(lo, hi + 1, (rows, hidden_size), generator=gen).to(dtype)
    b = None
    if bias is not None:
        b = torch.randint(-8, 9, (rows,), generator=gen).to(torch.float32 if bias == "f" else dtype)
    return h, w, b


def cpu_keys(h, w, b, vocab_start, num_valid, k=None, temperature=None, seed=0, offset=0):
    """The CPU kernel's keys on the generic path, named: auto may take brgemm
    (other bits) for bf16 / fp16 on AMX CPUs (DESIGN.md, "CPU paths")."""
    if k is not None:
        return ops.shard_topk(h, w, b, vocab_start, num_valid, k, "generic")
    if temperature is not None:
        return ops.shard_sample(h, w, b, vocab_start, num_valid, temperature, seed, offset, "generic")
    return ops.shard_argmax(h, w, b, vocab_start, num_valid, "generic")


def assert_keys_equal(got, want, what):
    assert got.shape == want.shape, what
    bad = (got != want).nonzero().flatten().tolist()
    assert not bad, (
        f"{what}: emulated keys differ from the CPU kernel's at rows {bad[:10]}: "
        f"{[hex(v & (2**64 - 1)) for v in got.flatten()[bad[:3]].tolist()]} vs "
        f"{[hex(v & (2**64 - 1)) for v in want.flatten()[bad[:3]].tolist()]}"
    )


def decode(keys):
    low = keys & 0xFFFFFFFF
    return 0xFFFFFFFF - low
