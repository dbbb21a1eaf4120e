"""Which kernel path serves a weight dtype: :func:`kernel_path`, the public
face of the C++ choice (csrc/cpu/cpu_path.h on CPU, cuda/mma_configs.h on
CUDA; DESIGN.md, "CPU paths")."""

from __future__ import annotations

import torch

from ._ext import _C
from ._validation import check_path_arg

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def kernel_path(
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    path: str = "auto",
    *,
    batch: int | None = None,
    rows: int | None = None,
    cpu_flags: str | None = None,
    op: str = "argmax",
) -> str:
    """The kernel path the ops (``shard_argmax``, ``shard_topk``,
    ``shard_sample`` and the ``lm_head_*`` steps built on them) run for
    weights of ``dtype`` on ``device`` when called with ``path=path``.

    Args:
        dtype: the weight's dtype: ``torch.float32``, ``torch.bfloat16`` or
            ``torch.float16`` (the hidden states' dtype does not decide it).
        device: ``"cpu"`` or ``"cuda"`` (a ``torch.device`` or a string such
            as ``"cuda:1"``; only its type counts).
        path: the ops' ``path=`` value: ``"auto"`` (the default) or a named
            path of that device (CPU: ``"generic"``, ``"avx2"``,
            ``"avx512"``, ``"avx512_bf16"``, ``"brgemm"``; CUDA: ``"simt"``,
            ``"mma"``, ``"gemm"``).
        batch: the batch size ``B`` of ``hidden [B, H]``, an int >= 0, or
            None. Needed on CUDA for ``path="auto"`` with bf16 / fp16
            weights; the CPU choice never depends on it (nor on any shape).
        rows: the shard's weight rows (``weight.shape[0]``, padding
            included), an int >= 0, or None (a shard gemm takes). CUDA's
            ``auto`` takes gemm only up to ``2**21`` rows (cuBLAS failed on
            ``2**31 - 1``), ``"mma"`` past it.
        cpu_flags: CPU only: answer for a CPU with these ``/proc/cpuinfo``
            flags (a space-separated string, e.g. ``"avx2 fma f16c avx512f
            amx_tile amx_bf16"``) instead of the one running; None (the
            default) reads this CPU's features (CPUID, as the ops do).
        op: ``"argmax"`` (default) or ``"sample"`` (the same paths), or
            ``"topk"`` (CUDA: no gemm path; ``auto`` runs ``"mma"`` for bf16 /
            fp16 at every batch).

    Returns:
        The path's name. CPU: one of ``"generic"``, ``"avx2"``,
        ``"avx512"``, ``"avx512_bf16"``, ``"brgemm"``. ``"auto"`` is
        ``"brgemm"`` for bf16 / fp16 weights where the CPU runs them on AMX
        tiles (``amx_tile`` with ``amx_bf16`` / ``amx_fp16``; its keys are
        not bit-identical to generic's and subnormal inputs are flushed),
        else ``"avx512_bf16"`` for bf16 weights where the CPU has
        ``avx512bw`` and ``avx512_bf16`` (vdpbf16ps: other bits, subnormals
        flushed), else the first of ``"avx512"``, ``"avx2"``, ``"generic"``
        the CPU has (bit-identical to generic, subnormals kept). CUDA: ``"simt"``,
        ``"mma"`` or ``"gemm"``: what the C++ ``auto`` picks, which is
        ``"simt"`` for float32 weights and, for bf16 / fp16, ``"mma"`` for
        top-k at every batch, for argmax and sample ``"gemm"`` from batch 17
        (shards up to ``2**21`` rows) and ``"mma"`` otherwise;
        ``"mma"`` there assumes inputs the tensor-core kernel takes (sm_80+,
        ``H`` and row strides multiples of 8, 16-byte aligned data), other
        inputs run ``"simt"``. A measured dispatch table
        (``LOCALARGMAX_DISPATCH_TABLE``) overrides the CUDA ``auto`` where it
        has a cell; this function answers without one.

    Raises:
        ValueError: ``dtype`` is not one of the three dtypes; ``device`` is
            not a CPU or CUDA device; ``path`` is not a path of the device;
            ``batch`` or ``rows`` is not an int in ``[0, 2**63)``, ``batch`` missing where the CUDA choice
            needs it; ``cpu_flags`` is not a string, or given for CUDA; a
            named CPU path the CPU lacks (the message names the features it
            needs and those missing, as the ops say it); ``"mma"`` /
            ``"gemm"`` with float32 weights, ``"gemm"`` with ``rows`` past
            ``2**21`` or for top-k; ``op`` not one of the three.
    """
    if op not in ("argmax", "topk", "sample"):
        raise ValueError(f"op must be 'argmax', 'topk' or 'sample', got {op!r}")
    topk = op == "topk"
    name = _DTYPE_NAMES.get(dtype) if isinstance(dtype, torch.dtype) else None
    if name is None:
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {dtype!r}")
    if not isinstance(device, (str, torch.device)):  # torch.device(3) is "cuda:3" on a CUDA build, refused on a CPU one
        raise ValueError(f"device must be 'cpu' or 'cuda' (a str or torch.device), got {device!r}")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError):
        raise ValueError(f"device must be 'cpu' or 'cuda' (a str or torch.device), got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (a str or torch.device), got {device!r}")
    check_path_arg(path, dev)
    for arg, value in (("batch", batch), ("rows", rows)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63):
            raise ValueError(f"{arg} must be None or an int in [0, 2**63), got {value!r}")
    if cpu_flags is not None and not isinstance(cpu_flags, str):
        raise ValueError(f"cpu_flags must be None or a space-separated str of /proc/cpuinfo flags, got {cpu_flags!r}")
    if dev.type == "cpu":
        return _C._cpu_path(path, cpu_flags, name)
    if cpu_flags is not None:
        raise ValueError("cpu_flags is for device='cpu' only")
    half = dtype != torch.float32
    if path != "auto":
        if path in ("mma", "gemm") and not half:
            raise ValueError(f"path={path!r} needs bfloat16 or float16 weights on CUDA, got {dtype}")
        if path == "gemm" and topk:
            raise ValueError("path='gemm' does not exist for top-k on CUDA; use 'auto', 'mma' or 'simt'")
        if path == "gemm" and rows is not None and _C._choose_cuda_path(True, False, True, 2**62, rows) != "gemm":
            raise ValueError(f"path='gemm' takes shards of at most 2**21 rows (cuBLAS), got rows={rows}")
        return path
    if topk:
        return _C._choose_cuda_path(half, True, True, batch or 0, rows or 0)
    if half and batch is None:
        raise ValueError(
            "on CUDA, auto's path for bfloat16 / float16 weights depends on the batch "
            "(gemm from 17 rows, mma below): pass batch="
        )
    return _C._choose_cuda_path(half, False, True, batch or 0, rows or 0)
