"""The kernel paths an op can run on, and the one helper that selects one.

CPU: the ``default`` build of the kernel (AVX2/FMA/F16C where the CPU has them)
and the portable ``generic`` one. CUDA: ``simt`` (CUDA-core fused kernel),
``mma`` (tensor-core fused kernel, bf16/fp16) and ``gemm`` (cuBLAS float32
logits, then a logits-to-keys kernel). :func:`use_path` is the only place that
knows how a path is chosen.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import torch

import localargmax


class KernelPath(NamedTuple):
    device: str  # "cpu" or "cuda"
    name: str  # CPU ISA ("default", "generic") or CUDA path ("simt", "mma", "gemm")

    def __str__(self) -> str:
        return self.device if self.name == "default" else f"{self.device}-{self.name}"


CPU_PATHS = (KernelPath("cpu", "default"), KernelPath("cpu", "generic"))
CUDA_PATHS = tuple(KernelPath("cuda", name) for name in ("simt", "mma", "gemm"))
ALL_PATHS = CPU_PATHS + CUDA_PATHS
_ENV = {"cpu": "LOCALARGMAX_CPU_ISA", "cuda": "LOCALARGMAX_CUDA_PATH"}


def unavailable(path: KernelPath) -> str | None:
    """Why this machine cannot run ``path`` (None if it can)."""
    if path.device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device"
        if not localargmax.WITH_CUDA:
            return "built without CUDA kernels"
    return None


@contextlib.contextmanager
def use_path(path: KernelPath) -> Iterator[KernelPath]:
    """Run the ops inside the block on ``path`` (the default CPU ISA is no setting)."""
    var = _ENV[path.device]
    saved = os.environ.get(var)
    if path.name == "default":
        os.environ.pop(var, None)
    else:
        os.environ[var] = path.name
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved


def poison_cuda_allocator() -> None:
    """Fill the caching allocator's free blocks with 0xFF bytes, so that an op
    that forgets to initialise its output returns garbage instead of zeros."""
    junk = torch.full((64 << 20,), -1, dtype=torch.int64, device="cuda")
    del junk


def each_cuda_path() -> Iterator[KernelPath]:
    """Every CUDA path in turn (allocator poisoned before each), for tests
    that compute one float64 reference and check all paths against it."""
    for path in CUDA_PATHS:
        with use_path(path):
            poison_cuda_allocator()
            yield path


def on(path: KernelPath, *tensors):
    """``tensors`` moved to ``path``'s device (None stays None)."""
    moved = tuple(None if t is None else t.to(path.device) for t in tensors)
    return moved if len(moved) != 1 else moved[0]


needs_cuda = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not localargmax.WITH_CUDA, reason="built without CUDA kernels"),
]
"""Marks of a test that needs a CUDA device; apply with :func:`cuda_only`."""


def cuda_only(fn):
    for mark in needs_cuda:
        fn = mark(fn)
    return fn
