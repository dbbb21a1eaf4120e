"""A bandwidth model of the CUDA paths: PREDICTED times, no GPU needed
(``python -m bench.predict_cli`` from the repository root).

For one (device, kernel variant, shard ``[rows, H]``, batch) it predicts the
time of one ``shard_argmax`` call and its fraction of the device's copy
bandwidth, from the kernel's tile shape, the bytes each CTA keeps in flight,
its registers (read from the built ``.so`` where possible) and the device's
SM count, bandwidth and memory latency:

* occupancy: CTAs per SM from registers (allocated per warp in units of
  256), threads and shared memory; ``slots = SMs x CTAs per SM``;
* waves: the grid's CTAs run in rounds of at most ``slots`` (wave
  quantisation: a last, part-empty round costs a whole CTA time when the CTAs
  are latency-bound);
* one round takes the longest of: a CTA's latency-bound time (Little's law
  per CTA: it moves its bytes ``in_flight`` at a time, one memory latency per
  step, plus a pipeline fill step, serial work and an epilogue), the round's
  weight bytes at the read-stream bandwidth, its weight + hidden bytes at the
  L2 bandwidth, its instructions at 4 warp-instructions per clock per SM
  (CUDA-core kernel), its tensor-core FLOPs (padded batch rows included);
* plus the fixed costs of a call: launch ramp and first latency, the
  separate zero-fill of the keys (variants with PDL or a fused init cut them).

Little's law in one line: a chip reaching bandwidth ``BW`` at latency ``L``
must keep ``BW x L`` bytes in flight (H200: 4.15 TB/s x 0.7 us = 2.9 MB, 22 KB
per SM); a kernel with less in flight is latency-bound at
``in_flight / L``. The gemm path (cuBLAS float32 logits + keys kernel) is
modelled as cuBLAS at a fixed efficiency plus the logits round trip.

Every figure is a prediction: the constants are in :data:`DEVICES` with their
sources; tests/test_bench_predict.py checks the arithmetic and the agreement
with a hand-worked table. A GPU run (``python -m bench.tune``) replaces the
choices with measured ones.
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from localargmax import _C
from localargmax._validation import MMA_CONFIGS, MmaConfig, op_kwargs

MODEL_VERSION = "3"
"""Bumped when the model's structure changes (the tables it writes record it)."""

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class DeviceSpec:
    """What the model knows of a GPU. Bandwidths in bytes/s, times in s."""

    name: str
    arch: str  # the dispatch table's key: "sm_90"
    sms: int
    clock_hz: float
    hbm_peak_Bps: float  # datasheet
    copy_Bps: float  # device-to-device copy, read + write bytes counted: the yardstick of fraction_of_copy
    stream_Bps: float  # the most a read-only kernel sustains: every variant's bandwidth cap
    l2_Bps: float  # L2 -> SM read bandwidth (weight + the hidden rows every CTA re-reads)
    latency_s: float  # DRAM load latency under load (central)
    latency_range_s: tuple[float, float]
    mma_sync_flops: float  # dense bf16 mma.sync m16n8k16, whole chip
    gemm_flops: float  # dense bf16 cuBLAS (wgmma), whole chip
    gemm_mem_efficiency: float  # cuBLAS skinny GEMM: fraction of stream_Bps when memory-bound
    gemm_compute_efficiency: float  # cuBLAS: fraction of gemm_flops when compute-bound
    launch_s: float  # launch ramp + first latency of a kernel not overlapped with its predecessor (no PDL)
    zero_fill_s: float  # the separate zero-fill of the keys (at::zeros) before the kernel
    gemm_second_launch_s: float  # gemm path: the keys kernel's launch and ramp
    cta_epilogue_s: float  # per CTA: reduction over warps, atomics, drain
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    smem_per_sm: int = 228 * KiB
    smem_reserved_per_cta: int = 1 * KiB
    l2_bytes: int = 50 * MiB
    link_Bps: float = 0.0  # NCCL collective bandwidth per GPU (bytes a rank receives per second), large messages
    collective_s: float = 0.0  # one small NCCL all-gather / all-to-all on the TP group (latency floor)
    sources: dict = field(default_factory=dict, compare=False)

    def little_bytes(self, latency_s: float | None = None) -> float:
        """Bytes the whole chip must keep in flight to reach ``stream_Bps``."""
        return self.stream_Bps * (self.latency_s if latency_s is None else latency_s)


H200 = DeviceSpec(
    name="H200",
    arch="sm_90",
    sms=132,
    clock_hz=1.98e9,
    hbm_peak_Bps=4.8e12,
    copy_Bps=4.3e12,
    stream_Bps=4.15e12,
    l2_Bps=5.5e12,
    latency_s=0.7e-6,
    latency_range_s=(0.6e-6, 0.8e-6),
    mma_sync_flops=470e12,
    gemm_flops=790e12,
    gemm_mem_efficiency=0.85,
    gemm_compute_efficiency=0.65,
    launch_s=2e-6,
    zero_fill_s=2e-6,
    gemm_second_launch_s=5e-6,
    cta_epilogue_s=1e-6,
    link_Bps=360e9,
    collective_s=10e-6,
    sources={
        "sms, regs_per_sm, max_threads_per_sm, max_ctas_per_sm, smem_per_sm": "Hopper GH100 limits (CUDA C "
        "Programming Guide, compute capability 9.0); review §2",
        "hbm_peak_Bps": "H200 datasheet 4.8 TB/s (anchors.md, Bandwidth ceilings)",
        "copy_Bps": "review §2: ~4.3 TB/s device-to-device copy (the review's figure; the bench's d2d-copy row "
        "measures it in every GPU run)",
        "stream_Bps": "review §2.3 refined model: 4.15 TB/s sustained by a read-only kernel (anchors.md quotes "
        "3.78 TB/s for RRZE-HPC's read-only microbenchmark: with it every fraction drops ~9%)",
        "latency_s": "review §2.2-2.3: 0.6-0.8 us DRAM latency under load, 0.7 central",
        "l2_Bps": "ASSUMED ~5.5 TB/s (public H100 L2 microbenchmarks; not in anchors.md): binds only where every "
        "CTA re-reads many hidden rows (batch 64 with 128-row tiles)",
        "mma_sync_flops": "ASSUMED 0.6 x the 790 TFLOP/s wgmma rate (anchors.md: 'mma.sync reaches well under that')",
        "gemm_flops": "anchors.md: ~790 dense bf16 TFLOP/s on H200 with wgmma",
        "gemm_mem_efficiency, gemm_compute_efficiency": "DESIGN.md 'Large batches': cuBLAS assumed at 0.85 of the "
        "stream when memory-bound, 0.60-0.75 of the GEMM rate when compute-bound",
        "launch_s, zero_fill_s, cta_epilogue_s": "review §2.3/§2.5(5): +4 us fixed per call (zero-fill ~1.5-2 us, "
        "launch ramp + first DRAM latency ~2-3 us), +1 us per CTA",
        "gemm_second_launch_s": "DESIGN.md 'Large batches': the keys kernel's second launch, ~5 us",
        "link_Bps": "ASSUMED 360 GB/s: NVLink 4 moves 450 GB/s per direction per H200 (datasheet: 900 GB/s "
        "bidirectional); NCCL's all-gather / all-to-all reach ~80% of it on large messages (not in the anchors)",
        "collective_s": "ASSUMED 10 us per NCCL collective on the TP group (anchors_2026-12.md §6: ring-LL gather "
        "~14.6 us on GB300, symmetric-memory 8-byte all-reduce ~2.3 us on 8xH200; vLLM's GroupCoordinator "
        "all-gather runs NCCL)",
    },
)

DEVICES = {"H200": H200}

# --- kernel variants ----------------------------------------------------------------------------------------


# MMA_CONFIGS: the tensor-core kernel's named configs, by name: the C++ table itself
# (csrc/cuda/mma_configs.h, read from ``_C._mma_configs()``), nothing mirrored.

DEFAULT_SM_COUNT = 132  # kDefaultSmCount
DEFAULT_SMEM_LIMIT = 227 * KiB  # kDefaultSmemLimit: opt-in shared memory per block (H100 / H200)


def twin_of(m: MmaConfig) -> str | None:
    """A TMA config's cp.async twin (the same fields but ``tma``: the same bits), else None."""
    if not m.tma:
        return None
    return next(c.name for c in MMA_CONFIGS.values() if not c.tma and c[1:9] == m[1:9])


def cpp_mma_config(
    num_valid: int,
    batch: int,
    sms: int = DEFAULT_SM_COUNT,
    smem_limit: int = DEFAULT_SMEM_LIMIT,
    tma: bool = False,
    log_partition: bool = False,
) -> str:
    """choose_mma_config (csrc/cuda/mma_configs.h, through ``_C``): the config C++ runs for path
    ``"mma"`` / ``"auto"`` (``tma``: the launch runs sm_90 code on an sm_90+ device, as on an H200;
    C++'s auto_takes_tma then takes the TMA rows unless ``log_partition``: the TMA rows
    at batch <= 32; else small grid: fewer than 4 blocks of 64 rows per SM; at batch 33-64
    256-row tiles where they give every SM a block, else 192-row ones; never a config whose shared
    memory exceeds ``smem_limit``)."""
    return _C._choose_mma_config(4096, num_valid, batch, sms, smem_limit, tma, log_partition)


def _order_kc(batch: int) -> int:
    """KC of the summation-order class C++ auto runs at ``batch`` (2 up to 32, 1 past it)."""
    return 2 if batch <= 32 else 1


def mma_candidates(batch: int) -> tuple[str, ...]:
    """The cp.async configs a dispatch table may name at ``batch``: those of
    the summation-order class C++ ``auto`` runs there (KC = 2 up to batch 32,
    KC = 1 past it), so a table config changes the speed, never the bits,
    against C++'s own choice (torch.compile, which cannot read the weight's
    alignment, passes ``"auto"``)."""
    return tuple(m.name for m in MMA_CONFIGS.values() if not m.tma and m.kc == _order_kc(batch))


def mma_tma_twins(batch: int) -> tuple[str, ...]:
    """The TMA configs of :func:`mma_candidates`' order class at ``batch``: ``bench.tune`` times them
    beside the candidates, but no table cell names them (they run on sm_90+ only, and a table config
    must run wherever the op takes the cell)."""
    return tuple(m.name for m in MMA_CONFIGS.values() if m.tma and m.kc == _order_kc(batch))


@dataclass(frozen=True)
class Variant:
    """One kernel instantiation: a CUDA path plus its template parameters.

    ``params`` are (name, value) pairs: ``simt`` ``nb`` (batch rows per
    pass), ``mma`` ``config`` (a key of :data:`MMA_CONFIGS`; named
    ``mma/<name>``), ``gemm`` (none). Only built kernels are modelled."""

    path: str
    params: tuple = ()

    def get(self, name: str, default=None):
        return dict(self.params).get(name, default)

    @property
    def mma(self) -> MmaConfig | None:
        return MMA_CONFIGS[self.get("config")] if self.path == "mma" and self.get("config") is not None else None

    @property
    def name(self) -> str:
        if self.mma is not None:
            return f"mma/{self.mma.name}"
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.path}({inner})" if inner else self.path

    @property
    def op_kwargs(self) -> dict:
        """The keywords of ``shard_argmax`` that run this variant (simt: its NB follows the batch)."""
        return op_kwargs(self.name if self.mma is not None else self.path)


def variant(path: str, **params) -> Variant:
    return Variant(path, tuple(params.items()))


def mma_variant(name: str) -> Variant:
    return variant("mma", config=name)


def todays_variant(path: str, batch: int, num_valid: int | None = None, sms: int = DEFAULT_SM_COUNT) -> Variant:
    """The instantiation the launcher runs for ``path`` at ``batch``
    (csrc/cuda/shard_launch.cuh: launch_simt's NB; launch_mma's
    choose_mma_config on an sm_90 device (its TMA rows), whose grid-size choice
    needs ``num_valid``: a large grid when not given). ``"mma/<name>"`` is that config."""
    if path == "simt":
        return variant("simt", nb=1 if batch <= 1 else 2 if batch <= 2 else 4 if batch <= 4 else 8)
    if path == "mma":
        return mma_variant(cpp_mma_config(num_valid if num_valid is not None else 1 << 30, batch, sms, tma=True))
    if path.startswith("mma/") and path[4:] in MMA_CONFIGS:
        return mma_variant(path[4:])
    if path == "gemm":
        return variant("gemm")
    raise ValueError(f"unknown CUDA path {path!r}")


def cpp_auto_path(batch: int, gemm_min_batch: int | None = None) -> str:
    """C++ ``path="auto"``'s choice for bf16 / fp16 argmax and sample, and their log-partition
    twins, on sm_80+ with aligned inputs: ``_C._choose_cuda_path`` (csrc/cuda/mma_configs.h; gemm
    from its gemm batch, else mma). ``gemm_min_batch``: another crossover (the model's what-if)."""
    if gemm_min_batch is None:
        return _C._choose_cuda_path(True, False, True, batch, 0)
    return "gemm" if batch >= gemm_min_batch else "mma"


# Registers per thread on sm_90a (bf16): the fallback when no CUDA build can be read. mma: the
# table's REGS90 column (csrc/cuda/mma_configs.h); simt: ptxas for sm_90a of the same build (nvcc
# 13.0; the review's §2.1 said 54 / 61 at NB = 1 / 8). tests/test_bench_predict.py compares both with
# the build.
DEFAULT_REGISTERS = {
    **{f"mma/{m.name}": m.regs90 for m in MMA_CONFIGS.values()},
    "simt(nb=1)": 69,
    "simt(nb=2)": 56,
    "simt(nb=4)": 54,
    "simt(nb=8)": 77,
}


@dataclass
class Registers:
    """Registers per thread by variant name, and where they came from."""

    by_variant: dict
    source: str

    def of(self, v: Variant) -> tuple[int, str]:
        if v.name in self.by_variant:
            return self.by_variant[v.name], self.source
        return DEFAULT_REGISTERS.get(v.name, 64), "default (sm_90a as built)"


# <T, NT .. MINB, TMA>: one build per config (a cp.async one also runs the log-partition); a build from
# before that (<..., TMA, LSE>: two bools) is not read, its LSE builds are not the argmax's registers
_PIPE_NAME = re.compile(r"shard_argmax_mma_pipe_kernelI(?:13__nv_bfloat16|6__half)((?:Li\d+E){8})Lb([01])E(?=EEv)")
_SIMT_NAME = re.compile(r"shard_argmax_kernelI13__nv_bfloat16Li(\d+)ELi8ELb0ELb0E")  # <T, NB, kVec, TOPK, LSE>: argmax
_MMA_BY_TEMPLATE = {(tuple(m[1:9]), m.tma): m.name for m in MMA_CONFIGS.values()}  # (NT .. MINB, TMA)


def parse_registers(text: str, arch: str = "sm_90") -> dict:
    """``{variant name: registers}`` of the bf16 argmax kernels of ``arch``
    (sm_90 also matches sm_90a) from ``cuobjdump --dump-resource-usage``
    output (``arch = sm_90a`` ... ``Function <mangled>: REG:150 ...``) or the
    ptxas lines of a build log (``Compiling entry function '<mangled>' for
    'sm_90a'`` then ``Used 150 registers``). mma kernels are named by their
    config name (``mma/n1_r64``); their fp16 and bf16 builds are listed
    separately, bf16 wins where both appear."""
    out: dict = {}
    current_arch = None
    pending = None  # ptxas: the function whose "Used N registers" line comes next
    text = re.sub(r"(Function \S+:)[ \t]*\n\s*(REG:)", r"\1\2", text)  # cuobjdump 13 puts REG: on the next line
    for line in text.splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            current_arch = m.group(1)
            continue
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", line)
        if m:
            pending = (m.group(1), m.group(2))
            continue
        m = re.search(r"Function (\S+?):.*\bREG:(\d+)", line)
        if m:
            _record(out, m.group(1), current_arch, arch, int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and pending is not None:
            _record(out, pending[0], pending[1], arch, int(m.group(1)))
            pending = None
    return out


def _record(out: dict, mangled: str, found_arch: str | None, arch: str, regs: int) -> None:
    if found_arch is None or not found_arch.startswith(arch):
        return
    m = _PIPE_NAME.search(mangled)
    if m is not None:
        template = (tuple(int(x) for x in re.findall(r"Li(\d+)E", m.group(1))), m.group(2) == "1")
        name = _MMA_BY_TEMPLATE.get(template)
        if name is not None and ("bfloat16" in mangled or f"mma/{name}" not in out):
            out[f"mma/{name}"] = regs
        return
    m = _SIMT_NAME.search(mangled)
    if m:
        out[f"simt(nb={m.group(1)})"] = regs


def read_registers(root: str | os.PathLike | None = None, arch: str = "sm_90", path: str | None = None) -> Registers:
    """Registers of the built kernels: ``path`` (a cuobjdump dump or build
    log) if given; else ``cuobjdump --dump-resource-usage`` of
    ``localargmax/_C*.so`` (cuobjdump from PATH, /usr/local/cuda/bin or the
    triton wheel), else the ptxas lines of ``build/cmake-*/build.log``; else
    :data:`DEFAULT_REGISTERS` (the source says which)."""
    if path is not None:
        found = parse_registers(Path(path).read_text(errors="replace"), arch)
        return Registers({**DEFAULT_REGISTERS, **found}, f"{path} ({len(found)} kernels)")
    if root is not None:
        root = Path(root)
        package = root / "localargmax"
    else:  # this checkout, and the installed package's folder (found, not imported: no torch)
        root = Path(__file__).resolve().parents[1]
        spec = importlib.util.find_spec("localargmax")
        package = Path(spec.origin).parent if spec is not None and spec.origin else root / "localargmax"
    tool = _cuobjdump()
    for so in sorted(glob.glob(str(package / "_C*.so"))):
        if tool is None:
            break
        try:
            text = subprocess.run(
                [tool, "--dump-resource-usage", so], capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found = parse_registers(text, arch)
        if found:
            return Registers({**DEFAULT_REGISTERS, **found}, f"cuobjdump {Path(so).name} ({len(found)} kernels)")
    for log in sorted(glob.glob(str(root / "build" / "cmake-*" / "build.log"))):
        found = parse_registers(Path(log).read_text(errors="replace"), arch)
        if found:
            return Registers({**DEFAULT_REGISTERS, **found}, f"ptxas lines of {log} ({len(found)} kernels)")
    return Registers(
        dict(DEFAULT_REGISTERS),
        "defaults: no CUDA build to read (sm_90a as built, ptxas)",
    )


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = ["/usr/local/cuda/bin/cuobjdump"]
    try:
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


# --- the model ----------------------------------------------------------------------------------------------


@dataclass
class Geometry:
    """What the model needs of one launch (per CTA unless said otherwise)."""

    ctas: int
    threads: int
    smem: int
    cta_bytes: float  # weight bytes from HBM
    cta_l2_bytes: float  # hidden bytes re-read from L2
    cta_in_flight: float  # weight bytes kept in flight
    cta_serial_s: float  # serial work outside the memory stream
    cta_instructions: float  # warp-instructions (issue-bound CUDA-core kernel), else 0
    cta_flops: float  # tensor-core FLOPs, padded batch rows included
    passes: int  # times the weight is streamed
    fixed_s: float


@dataclass
class Prediction:
    """One predicted call. ``fraction_of_copy`` = weight bytes / time / copy bandwidth."""

    variant: Variant
    rows: int
    hidden: int
    batch: int
    time_s: float
    fraction_of_copy: float
    bound: str  # "bandwidth" | "latency" | "l2" | "issue" | "compute" | "gemm-memory" | "gemm-compute"
    ctas: int = 0
    ctas_per_sm: int = 0
    rounds: int = 0
    regs: int | None = None
    regs_source: str = ""
    in_flight_per_sm: float = 0.0
    little_per_sm: float = 0.0

    @property
    def us(self) -> float:
        return self.time_s * 1e6


def ctas_per_sm(spec: DeviceSpec, threads: int, regs: int, smem: int) -> int:
    """Resident CTAs per SM: registers (per-warp allocation in units of 256),
    threads, shared memory (plus the per-CTA reservation), the CTA limit."""
    warps = -(-threads // 32)
    regs_per_warp = -(-regs * 32 // 256) * 256
    by_regs = (spec.regs_per_sm // regs_per_warp) // warps
    by_threads = spec.max_threads_per_sm // threads
    by_smem = spec.smem_per_sm // (smem + spec.smem_reserved_per_cta)
    return max(0, min(by_regs, by_threads, by_smem, spec.max_ctas_per_sm))


def geometry(spec: DeviceSpec, v: Variant, rows: int, hidden: int, batch: int, elem: int = 2) -> Geometry:
    """The launch of the Little's-law variants (simt, mma)."""
    fixed = spec.launch_s + spec.zero_fill_s  # launched plainly, after the keys' zero fill
    if v.path == "simt":  # 8 warps x 64 rows; a warp walks its 8 rows, 4 x 16 B per lane in flight
        nb = v.get("nb")
        tiles, passes = -(-rows // 64), -(-batch // nb)
        cta_bytes = rows * hidden * elem / tiles
        vec_steps = cta_bytes / 512  # warp-steps of one 16-byte vector per lane
        # per warp-step: unpack the weight vector (8), then per batch row: hidden load + unpack (9) and
        # one __fmaf_rn per element (8): 144 per 512 B at NB = 8 (the review's ~200 counted mul + add)
        instructions = vec_steps * (8 + min(nb, batch) * 17)
        return Geometry(
            ctas=tiles * passes,
            threads=256,
            smem=8 * nb * 8 + 64,
            cta_bytes=cta_bytes,
            cta_l2_bytes=min(nb, batch) * hidden * elem,
            cta_in_flight=8 * 4 * 32 * 16,
            cta_serial_s=8 * 0.15e-6,  # per row: the 32-lane butterfly and the key, 8 rows per warp in turn
            cta_instructions=instructions,
            cta_flops=0.0,
            passes=passes,
            fixed_s=fixed,
        )
    if v.path != "mma":
        raise ValueError(f"geometry: {v.path} is not a Little's-law variant")
    if v.mma is None:
        raise ValueError(f"geometry: {v.name} is not a built mma config")
    return _pipe_geometry(spec, v.mma, rows, hidden, batch, elem)


# Warp-instructions of the pipelined kernel, per warp and 32-element k chunk (fused_keys_mma.cuh):
# MT x (live n-tiles) x 2 mma.sync (m16n8k16), 2 shared loads per m-tile and 1 per live n-tile (16 bytes per
# lane and row; an n-tile is live when it holds a batch row),
# and PIPE_COPY_INSTRUCTIONS per 16-byte cp.async a thread issues (address math, predicate, LDGSTS); plus
# PIPE_STEP_INSTRUCTIONS per warp and pipeline step (wait, barrier, commit, loop). Estimates from the
# kernel text, not from SASS.
PIPE_COPY_INSTRUCTIONS = 4
PIPE_STEP_INSTRUCTIONS = 12
# The TMA configs (tma=True) copy only the hidden rows by cp.async; the weight of a step is KC
# bulk tensor copies that one thread issues (coordinates, UTMALDG: PIPE_TMA_BOX_INSTRUCTIONS
# per box, in one warp) after a proxy fence and the mbarrier's arrive.expect_tx, and every warp
# waits on the stage's mbarrier (try_wait, parity): PIPE_TMA_STEP_INSTRUCTIONS per warp and step
# on top of PIPE_STEP_INSTRUCTIONS. Estimates from the kernel text, not from SASS.
PIPE_TMA_BOX_INSTRUCTIONS = 6
PIPE_TMA_STEP_INSTRUCTIONS = 4


def _pipe_geometry(spec: DeviceSpec, m: MmaConfig, rows: int, hidden: int, batch: int, elem: int) -> Geometry:
    """shard_argmax_mma_pipe_kernel (every config): a CTA owns ``m.rows`` weight rows and ``8 NT WN`` batch
    rows (further rows: more passes, grid y); ST stages of KC chunks of (rows + 8 NT WN) x 64 bytes; the
    weight of ST - 1 steps in flight; SK warp groups split each step's chunks (partials added through
    shared memory at the end: no extra CTAs); launched with PDL (sm_90+), after the keys' zero fill. Only the
    n-tiles that hold a batch row are loaded and multiplied (``live``: those of a full pass, or of the one
    pass a smaller batch takes)."""
    tiles, passes = -(-rows // m.rows), -(-batch // m.batch_rows)
    live = min(m.nt * m.wn, -(-batch // 8))
    warps = m.threads // 32
    chunks = -(-hidden // 32)
    steps = -(-chunks // m.kc)
    tma = m.tma  # the weight by bulk tensor copy: only the hidden rows by cp.async
    copies = ((0 if tma else m.rows) + 8 * live) * 64 * m.kc / 16 / 32  # warp-wide 16-byte cp.async per step
    per_chunk = m.mt * live * 2 + 2 * m.mt * m.wn + live  # per warp row (WN warps): mma + shared loads
    per_step = copies * PIPE_COPY_INSTRUCTIONS + warps * PIPE_STEP_INSTRUCTIONS
    if tma:
        per_step += m.kc * PIPE_TMA_BOX_INSTRUCTIONS + warps * PIPE_TMA_STEP_INSTRUCTIONS
    instructions = chunks * m.wm * per_chunk + steps * per_step
    return Geometry(
        ctas=tiles * passes,
        threads=m.threads,
        smem=m.smem,
        cta_bytes=rows * hidden * elem / tiles,
        cta_l2_bytes=min(m.batch_rows, batch) * hidden * elem,
        cta_in_flight=(m.st - 1) * m.kc * m.rows * 32 * elem,
        cta_serial_s=0.0,
        cta_instructions=instructions,
        cta_flops=2.0 * m.rows * 8 * live * hidden,
        passes=passes,
        fixed_s=spec.launch_s * 0.25 + spec.zero_fill_s,
    )


def predict(
    spec: DeviceSpec,
    v: Variant,
    rows: int,
    hidden: int,
    batch: int,
    elem: int = 2,
    latency_s: float | None = None,
    registers: Registers | None = None,
) -> Prediction:
    """The predicted time of one call of variant ``v`` on a ``[rows, hidden]``
    shard at ``batch`` (see the module docstring)."""
    if rows < 1 or hidden < 1 or batch < 1:
        raise ValueError(f"predict: rows, hidden and batch must be >= 1, got {rows}, {hidden}, {batch}")
    lat = spec.latency_s if latency_s is None else latency_s
    useful = rows * hidden * elem
    if v.path == "gemm":
        return _predict_gemm(spec, v, rows, hidden, batch, elem, useful)
    g = geometry(spec, v, rows, hidden, batch, elem)
    regs, regs_source = (registers or Registers({}, "")).of(v)
    per_sm = ctas_per_sm(spec, g.threads, regs, g.smem)
    if per_sm < 1:
        raise ValueError(f"{v.name}: no CTA fits on an SM ({regs} registers, {g.smem} bytes of shared memory)")
    slots = spec.sms * per_sm
    steps = math.ceil(g.cta_bytes / g.cta_in_flight) + 1  # + the pipeline fill (first loads)
    cta_latency = steps * lat + g.cta_serial_s + spec.cta_epilogue_s

    def round_time(n: int) -> tuple[float, str]:
        active = min(n, spec.sms)
        terms = {
            "latency": cta_latency,
            "bandwidth": n * g.cta_bytes / spec.stream_Bps,
            "l2": n * (g.cta_bytes + g.cta_l2_bytes) / spec.l2_Bps,
            "issue": (n / active) * g.cta_instructions / (4 * spec.clock_hz),
            "compute": n * g.cta_flops / (spec.mma_sync_flops * active / spec.sms),
        }
        bound = max(terms, key=terms.get)
        return terms[bound], bound

    full, rest = divmod(g.ctas, slots)
    t_full, bound = round_time(slots) if full else (0.0, "")
    t_rest, bound_rest = round_time(rest) if rest else (0.0, "")
    total = full * t_full + t_rest + g.fixed_s
    if full * t_full < t_rest:
        bound = bound_rest
    resident = min(g.ctas, slots) / spec.sms
    return Prediction(
        variant=v,
        rows=rows,
        hidden=hidden,
        batch=batch,
        time_s=total,
        fraction_of_copy=useful / total / spec.copy_Bps,
        bound=bound,
        ctas=g.ctas,
        ctas_per_sm=per_sm,
        rounds=full + (1 if rest else 0),
        regs=regs,
        regs_source=regs_source,
        in_flight_per_sm=resident * g.cta_in_flight,
        little_per_sm=spec.little_bytes(lat) / spec.sms,
    )


def _predict_gemm(spec, v, rows, hidden, batch, elem, useful) -> Prediction:
    """cuBLAS float32 logits per batch chunk (<= 1 GiB of logits; the GEMM
    covers the padded rows, here ``rows`` rounded up to 64), then the keys
    kernel re-reads them: max(memory, compute) per GEMM + the logits' write and
    read + the second launch per chunk + the call's fixed costs."""
    padded = -(-rows // 64) * 64
    chunk = max(1, (1024 * MiB) // 4 // padded)  # csrc/cuda/shard_gemm.cu
    gemms = -(-batch // chunk)
    t_mem = padded * hidden * elem / (spec.gemm_mem_efficiency * spec.stream_Bps)
    t = 0.0
    bound = "gemm-memory"
    for i in range(gemms):
        n = min(chunk, batch - i * chunk)
        t_cmp = 2.0 * n * padded * hidden / (spec.gemm_compute_efficiency * spec.gemm_flops)
        if t_cmp > t_mem:
            bound = "gemm-compute"
        t += max(t_mem, t_cmp) + 8.0 * n * padded / spec.stream_Bps + spec.gemm_second_launch_s
    t += spec.launch_s + spec.zero_fill_s
    return Prediction(v, rows, hidden, batch, t, useful / t / spec.copy_Bps, bound, rounds=gemms)


# --- engine shapes and candidates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineShape:
    """One rank's shard of a preset lm_head (rank 0 of the standard layout)."""

    model: str
    tp: int
    vocab: int
    hidden: int
    rows: int  # valid rows of rank 0 (what the kernel reads)
    padded_rows: int  # the shard's rows (equal on every rank: the dispatch table's key)

    @property
    def label(self) -> str:
        return f"{self.model} tp{self.tp}"


PRESET_SHAPES = {  # = localargmax.bench.data.PRESETS (kept torch-free here; a test checks they agree)
    "qwen3": (151936, 4096),
    "llama3": (128256, 4096),
    "llama3-70b": (128256, 8192),
    "deepseek-v3": (129280, 7168),
}
ENGINE_SHAPES = (("qwen3", 1), ("qwen3", 4), ("qwen3", 8), ("llama3", 8), ("deepseek-v3", 8))
"""The issue's table (#15): Qwen3 tp 1/4/8, Llama-3 tp 8, DeepSeek-V3 tp 8."""
ENGINE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BAR_FRACTION = 0.88
BAR_MAX_BATCH = 64


def engine_shape(model: str, tp: int) -> EngineShape:
    from localargmax.layout import shard_vocab

    vocab, hidden = PRESET_SHAPES[model]
    shard = shard_vocab(vocab, 0, tp, pad_to=64)
    return EngineShape(model, tp, vocab, hidden, shard.num_valid, shard.rows)


def engine_shapes(pairs: Iterable[tuple[str, int]] = ENGINE_SHAPES) -> list[EngineShape]:
    return [engine_shape(m, tp) for m, tp in pairs]


def built_candidates(batch: int) -> list[Variant]:
    """What a dispatch table can choose at ``batch``: simt's instantiation, the
    mma configs of :func:`mma_candidates`, gemm."""
    return [todays_variant("simt", batch), *(mma_variant(i) for i in mma_candidates(batch)), variant("gemm")]


def with_latency(spec: DeviceSpec, latency_s: float) -> DeviceSpec:
    return replace(spec, latency_s=latency_s)


# --- C++ auto's defaults (csrc/cuda/mma_configs.h), from the model ------------------------------------

DEFAULTS_BATCHES = range(1, 257)


def cpp_defaults(spec: DeviceSpec = H200, registers: Registers | None = None, hysteresis: float = 1.03) -> dict:
    """The C++ ``auto`` constants the model gives for the pipelined kernel on the engine shapes
    (kDefaultGemmMinBatch, mirrored by dispatch.CPP_GEMM_MIN_BATCH; and whether a small-shard
    simt rule would pay, which C++ does not have):

    * ``gemm_min_batch``: the batch threshold (gemm from it, choose_mma_config's mma below it)
      with the smallest worst slowdown against the faster of the two over the engine shapes
      and batches 1-256 (ties: the larger threshold);
    * ``simt_max_batch``: the largest batch <= 8 up to which simt beats C++'s mma variant by
      more than ``hysteresis`` on every shard of fewer than ``simt_max_rows_per_sm`` rows per
      SM (2 tiles of 128 rows: the tp-8 shards), else 0 (no simt rule)."""
    shapes = engine_shapes()
    t = {}
    for s in shapes:
        for b in DEFAULTS_BATCHES:
            mma = predict(spec, todays_variant("mma", b, s.rows, spec.sms), s.rows, s.hidden, b, registers=registers)
            gemm = predict(spec, variant("gemm"), s.rows, s.hidden, b, registers=registers)
            t[(s, b)] = (mma.time_s, gemm.time_s)

    def worst(threshold: int) -> float:
        return max((g if b >= threshold else m) / min(m, g) for (_, b), (m, g) in t.items())

    gemm_min = min(range(2, DEFAULTS_BATCHES[-1] + 2), key=lambda x: (round(worst(x), 6), -x))
    rows_per_sm = 256
    small = [s for s in shapes if s.padded_rows < rows_per_sm * spec.sms]
    simt_max = 0
    for b in range(1, 9):
        simt = {
            s: predict(spec, todays_variant("simt", b), s.rows, s.hidden, b, registers=registers).time_s for s in small
        }
        if small and all(simt[s] * hysteresis < t[(s, b)][0] for s in small):
            simt_max = b
        else:
            break
    return {
        "gemm_min_batch": gemm_min,
        "gemm_worst_slowdown": round(worst(gemm_min), 4),
        "simt_max_batch": simt_max,
        "simt_max_rows_per_sm": rows_per_sm,
    }


# --- the target's sampling under TP (issue #57 item 3) -------------------------------------------------------

NOISE_INSTRUCTIONS = 80
"""ASSUMED lane-instructions per logit of vLLM's Gumbel noise and score (murmur3 ~25 integer operations, the
uniform and the log1p series ~20, two logf ~30, the division and add): the same in vLLM's gumbel_sample and in
our keys kernel (common/vllm_noise.h)."""
SAMPLER_BYTES = 10
"""Bytes per logit vLLM's Sampler moves on the gathered ``[B, V]`` bf16 logits at a temperature: the read of
the bf16 logits and their float32 copy (``apply_sampling_params``: 2 + 4), then gumbel_sample's read (4)."""
TARGET_METHODS = ("full-gather", "batch-sharded", "fused")


@dataclass(frozen=True)
class TargetPrediction:
    """One rank's PREDICTED sampling step of the target (temperature-only rows, vLLM's noise), by method."""

    method: str
    model: str
    tp: int
    batch: int
    sent_bytes: int  # bytes this rank sends in the step's collectives
    recv_bytes: int
    time_s: float
    terms: dict  # seconds per part: logits, exchange, sample

    @property
    def us(self) -> float:
        return self.time_s * 1e6


def collective_time(spec: DeviceSpec, tp: int, recv_bytes: float) -> float:
    """One collective on the TP group in which this rank receives ``recv_bytes``: its latency floor plus the
    bytes at the link rate (0 at ``tp`` 1: nothing is exchanged)."""
    return 0.0 if tp == 1 else spec.collective_s + recv_bytes / spec.link_Bps


def noise_time(spec: DeviceSpec, logits: float) -> float:
    """vLLM's noise and score on ``logits`` entries, issue-bound on the CUDA cores (4 warp-instructions per
    clock per SM)."""
    return logits * NOISE_INSTRUCTIONS / (32 * 4 * spec.sms * spec.clock_hz)


def vllm_logits_time(spec: DeviceSpec, rows: int, hidden: int, batch: int, elem: int = 2) -> float:
    """vLLM's local logits ``[B, rows]`` (cuBLAS in the weight dtype): the weight read or the GEMM, whichever
    binds, the logits written in that dtype, one launch."""
    t_mem = rows * hidden * elem / (spec.gemm_mem_efficiency * spec.stream_Bps)
    t_cmp = 2.0 * batch * rows * hidden / (spec.gemm_compute_efficiency * spec.gemm_flops)
    return max(t_mem, t_cmp) + batch * rows * elem / spec.stream_Bps + spec.launch_s


def vllm_sampler_time(spec: DeviceSpec, rows: int, vocab: int) -> float:
    """vLLM's Sampler on ``[rows, vocab]`` gathered logits at a temperature: :data:`SAMPLER_BYTES` per logit
    against the noise's compute (overlapped), two kernels' launches."""
    n = rows * vocab
    return max(n * SAMPLER_BYTES / spec.stream_Bps, noise_time(spec, n)) + 2 * spec.launch_s


def predict_target_sampling(spec: DeviceSpec, shape: EngineShape, batch: int, elem: int = 2) -> list[TargetPrediction]:
    """Rank 0's PREDICTED time of one target sampling step on ``shape`` at ``batch`` (temperature-only rows,
    vLLM's noise), per method, with the bytes it sends and receives (the CPU benchmark's byte plans):

    * full-gather (vLLM's default): local logits, an all-gather of the ``[B, rows]`` logits, then every rank
      runs the Sampler on ``[B, V]``;
    * batch-sharded (vLLM 0.34's ``enable_batch_sharded_sampling``): local logits, an all-to-all that gives
      each rank the full logits of the rows it owns, the Sampler on those ``ceil(B / tp)`` rows, then an
      all-gather of the sampled ids;
    * fused (``lm_head_sample(noise=)``, the CUDA gemm path): cuBLAS float32 logits of the shard and the keys
      kernel with the noise (:func:`_predict_gemm`, the noise's compute beyond the logits' read added), then
      one key per row exchanged."""
    from localargmax.bench.filtered import batch_sharded_bytes, owned_rows
    from localargmax.collective import payload_length

    tp, rows, vocab = shape.tp, shape.padded_rows, shape.vocab
    logits = vllm_logits_time(spec, rows, shape.hidden, batch, elem)
    out = []
    per_rank = batch * rows * elem
    terms = {"logits": logits, "exchange": collective_time(spec, tp, (tp - 1) * per_rank)}
    terms["sample"] = vllm_sampler_time(spec, batch, vocab)
    out.append(("full-gather", per_rank if tp > 1 else 0, (tp - 1) * per_rank, terms))
    sent, recv = batch_sharded_bytes(batch, rows, elem, tp)
    ids = 8 * -(-batch // tp) * (tp - 1)
    own = max(owned_rows(batch, tp, 0), 1)
    terms = {"logits": logits, "exchange": collective_time(spec, tp, recv - ids) + collective_time(spec, tp, ids)}
    terms["sample"] = vllm_sampler_time(spec, own, vocab)
    out.append(("batch-sharded", sent, recv, terms))
    gemm = _predict_gemm(spec, variant("gemm"), rows, shape.hidden, batch, elem, rows * shape.hidden * elem)
    extra_noise = max(0.0, noise_time(spec, batch * rows) - 4.0 * batch * rows / spec.stream_Bps)
    words = 8 * payload_length(batch, 1, align_bytes=16) if tp > 1 else 0  # the vLLM plugin's 16-byte frames
    terms = {"logits": gemm.time_s, "sample": extra_noise, "exchange": collective_time(spec, tp, (tp - 1) * words)}
    out.append(("fused", words, (tp - 1) * words, terms))
    return [TargetPrediction(m, shape.model, tp, batch, int(s), int(r), sum(t.values()), dict(t)) for m, s, r, t in out]
