"""The kernel paths an op can run on, and the one helper that selects one.

CPU: the ``default`` build of the kernel (``path="auto"``: AVX-512F, else
AVX2/FMA/F16C, where the CPU has them) and the portable ``generic`` one; the
named ISA paths (:data:`CPU_ISA_PATHS`) where the tests ask for them. CUDA: ``simt`` (CUDA-core fused kernel),
``mma`` (tensor-core fused kernel, bf16/fp16) and ``gemm`` (cuBLAS float32
logits, then a logits-to-keys kernel). :func:`use_path` is the only place that
knows how a path is chosen (the ops' ``path=`` keyword).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import NamedTuple
from unittest import mock

import pytest
import torch

import localargmax
from localargmax._validation import CPU_PATHS as CPU_TABLE


class KernelPath(NamedTuple):
    device: str  # "cpu" or "cuda"
    name: str  # CPU ("default", or a name of CPU_ISA_PATHS) or CUDA path ("simt", "mma", "gemm")

    def __str__(self) -> str:
        return self.device if self.name == "default" else f"{self.device}-{self.name}"


CPU_PATHS = (KernelPath("cpu", "default"), KernelPath("cpu", "generic"))
CPU_ISA_PATHS = tuple(CPU_TABLE)
"""Every CPU path the ops' ``path=`` names (besides ``"auto"``): the C++ table's."""
BIT_EXACT_CPU_PATHS = tuple(name for name, p in CPU_TABLE.items() if p.bit_exact)
"""The CPU paths whose keys are bit-identical to generic's for every dtype
(DESIGN.md rule 5; ``avx512_bf16`` only for float32 / float16 weights)."""
CUDA_PATHS = tuple(KernelPath("cuda", name) for name in ("simt", "mma", "gemm"))
ALL_PATHS = CPU_PATHS + CUDA_PATHS


def unavailable(path: KernelPath) -> str | None:
    """Why this machine cannot run ``path`` (None if it can)."""
    if path.device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device"
        if not localargmax.WITH_CUDA:
            return "built without CUDA kernels"
    elif path.name != "default":
        return cpu_path_unavailable(path.name)
    return None


def cpu_path_unavailable(name: str) -> str | None:
    """Why this CPU cannot run the CPU path ``name`` (the op's own refusal,
    naming the missing CPU features), or None if it can."""
    try:
        localargmax.kernel_path(torch.float32, "cpu", name)
    except ValueError as e:
        return str(e)
    return None


def brgemm_mode(dtype: torch.dtype, cpu_flags: str | None = None) -> str | None:
    """How ATen runs the brgemm path for weights of ``dtype`` (DESIGN.md,
    "CPU paths", brgemm): on this CPU (``cpu_flags`` None) ATen's own answer,
    ``_C._brgemm_mode``; for a CPU with ``cpu_flags`` what DESIGN.md
    documents: ``"amx"`` where the tiles run the dtype (``amx_tile`` and
    ``amx_bf16`` / ``amx_fp16``), ``"vnni"`` for bf16 with AVX-512-BF16
    (oneDNN's vdpbf16ps ukernel), ``"plain"`` for float32, fp16 without
    AMX-FP16 and a CPU without AVX-512F (ATen refuses a VNNI B there); None
    where DESIGN.md says nothing (bf16 on AVX-512F without AVX-512-BF16)."""
    name = str(dtype).removeprefix("torch.")
    if cpu_flags is None:
        return localargmax._C._brgemm_mode(name)
    have = set(cpu_flags.split())
    if dtype != torch.float32 and {"amx_tile", "amx_bf16" if dtype == torch.bfloat16 else "amx_fp16"} <= have:
        return "amx"
    if dtype == torch.bfloat16 and {"avx512f", "avx512_bf16"} <= have:
        return "vnni"
    if dtype != torch.bfloat16 or "avx512f" not in have:
        return "plain"
    return None


def flushes_denormals(name: str, dtype: torch.dtype, cpu_flags: str | None = None) -> bool:
    """Whether CPU path ``name`` (or ``"auto"``, resolved for ``dtype`` by
    :func:`localargmax.kernel_path`) may flush subnormal inputs, products or
    sums for weights of ``dtype`` whatever MXCSR says, on this CPU or on one
    with ``cpu_flags`` (DESIGN.md, "CPU paths"): avx512_bf16's vdpbf16ps for
    bf16, and brgemm where ATen runs it with a VNNI B (:func:`brgemm_mode`
    "amx": the AMX tiles, "vnni": oneDNN's AVX-512-BF16 ukernel, None:
    undocumented, so it may). Every other path keeps them (bit-exact paths,
    brgemm "plain")."""
    chosen = localargmax.kernel_path(dtype, "cpu", name, cpu_flags=cpu_flags)
    if chosen == "avx512_bf16":
        return dtype == torch.bfloat16
    return chosen == "brgemm" and brgemm_mode(dtype, cpu_flags) != "plain"


def bit_identical_to_generic(name: str, dtype: torch.dtype, cpu_flags: str | None = None) -> bool:
    """Whether CPU path ``name`` (or ``"auto"``, resolved for ``dtype``) gives
    generic's keys bit for bit for weights of ``dtype`` (DESIGN.md rule 5:
    generic, avx2, avx512 for every dtype; avx512_bf16 for float32 / float16;
    brgemm never)."""
    chosen = localargmax.kernel_path(dtype, "cpu", name, cpu_flags=cpu_flags)
    return chosen in BIT_EXACT_CPU_PATHS or (chosen == "avx512_bf16" and dtype != torch.bfloat16)


def bit_exact_cpu_paths() -> tuple[KernelPath, ...]:
    """:data:`CPU_PATHS` and every other path of :data:`BIT_EXACT_CPU_PATHS`
    this CPU has (auto's own choice is ``default`` already)."""
    auto = localargmax.kernel_path(torch.float32)
    extra = [KernelPath("cpu", n) for n in BIT_EXACT_CPU_PATHS if n not in ("generic", auto)]
    return CPU_PATHS + tuple(p for p in extra if cpu_path_unavailable(p.name) is None)


# "default" is auto's float32 choice: auto itself for every dtype on a CPU
# without AMX; on AMX, auto runs brgemm for bf16 / fp16 (not bit-exact,
# tests/test_cpu_paths.py), and the CPU reference stays bit-exact
_KEYWORD = {
    "default": localargmax.kernel_path(torch.float32),
    **{n: n for n in CPU_ISA_PATHS},
    "simt": "simt",
    "mma": "mma",
    "gemm": "gemm",
}
_OPS = ("shard_argmax", "shard_topk", "shard_sample")


def path_keyword(
    path: KernelPath, op: str = "shard_argmax", hidden_size: int | None = None, dtype: torch.dtype | None = None
) -> str:
    """The ops' ``path=`` value that runs ``op`` on ``path``: float32
    weights have no mma / gemm path and top-k no gemm path (they run on auto
    there), and a hidden size the mma kernel does not take (not a multiple of
    8) runs on auto too (the refusals are tested on their own)."""
    kw = _KEYWORD[path.name]
    if (kw in ("mma", "gemm") and dtype == torch.float32) or (kw == "gemm" and op == "shard_topk"):
        return "auto"
    if kw == "mma" and hidden_size is not None and hidden_size % 8:
        return "auto"
    return kw


def _bound(op: str, fn, path: KernelPath):
    @functools.wraps(fn)
    def call(hidden, weight, *args, **kwargs):
        size = hidden.shape[-1] if isinstance(hidden, torch.Tensor) and hidden.dim() else None
        dtype = weight.dtype if isinstance(weight, torch.Tensor) else None
        kwargs.setdefault("path", path_keyword(path, op, size, dtype))
        return fn(hidden, weight, *args, **kwargs)

    return call


_OP_OF_KIND = {"argmax": "shard_argmax", "topk": "shard_topk", "sample": "shard_sample"}


def _bound_plan(plan_cls, path: KernelPath):
    """``StepPlan`` with its ``path=`` defaulting to ``path`` (as the op of the plan's kind)."""

    class Bound(plan_cls):
        def __init__(self, weight, **kwargs):
            if isinstance(weight, torch.Tensor) and weight.dim() == 2:
                op = _OP_OF_KIND.get(kwargs.get("kind", "argmax"), "shard_argmax")
                kwargs.setdefault("path", path_keyword(path, op, weight.shape[-1], weight.dtype))
            super().__init__(weight, **kwargs)

    return Bound


@contextlib.contextmanager
def use_path(path: KernelPath) -> Iterator[KernelPath]:
    """Run the ops and plans made inside the block on ``path``: binds the
    ops' and ``StepPlan``'s ``path=`` keyword (:func:`path_keyword`) in every
    localargmax module that imported them (``localargmax``, ``ops``,
    ``plan``, the steps in ``step`` and ``sampling``, ...), for the block."""
    import localargmax.ops as ops
    import localargmax.plan as plan
    import localargmax.sampling  # noqa: F401  (imported so its names are bound too)

    holders = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "localargmax"]
    with contextlib.ExitStack() as stack:
        for name, fn, bound in [(op, getattr(ops, op), _bound(op, getattr(ops, op), path)) for op in _OPS] + [
            ("StepPlan", plan.StepPlan, _bound_plan(plan.StepPlan, path))
        ]:
            for module in holders:
                if getattr(module, name, None) is fn:
                    stack.enter_context(mock.patch.object(module, name, bound))
        yield path


def poison_cuda_allocator() -> None:
    """Fill the caching allocator's free blocks with 0xFF bytes, so that an op
    that forgets to initialise its output returns garbage instead of zeros."""
    junk = torch.full((64 << 20,), -1, dtype=torch.int64, device="cuda")
    del junk


def each_cpu_path_and_thread_count(threads=(1, 2)) -> Iterator[tuple[str, int]]:
    """``(path name, threads)`` for every bit-exact CPU path this CPU has
    (:func:`bit_exact_cpu_paths`) and torch thread count in turn, that path
    bound and that many threads set; torch's thread count is restored
    afterwards."""
    saved = torch.get_num_threads()
    try:
        for path in bit_exact_cpu_paths():
            for n in threads:
                torch.set_num_threads(n)
                with use_path(path):
                    yield str(path), n
    finally:
        torch.set_num_threads(saved)


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
