"""A bandwidth model of the CUDA paths: PREDICTED times, no GPU needed
(``localargmax-bench --predict``).

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
sources (shared/reviews/cuda_h200_review.md §2, shared/reviews/anchors.md);
tests/test_bench_predict.py checks the arithmetic and the agreement with the
review's table. A GPU run (``localargmax-bench --tune``) replaces the choices.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..dispatch import CPP_GEMM_MIN_BATCH, CPP_SIMT_MAX_BATCH, CPP_SIMT_MAX_ROWS_PER_SM

MODEL_VERSION = "2"
"""Bumped when the model's structure changes (the table records it and the
sha256 of this file)."""

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
    },
)

DEVICES = {"H200": H200}

# --- kernel variants ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MmaSpec:
    """One row of the ``MmaVariant`` table (csrc/cuda/shard_argmax_launch.cuh):
    ``reg`` = shard_argmax_mma_kernel<T, NT, KV> (ids 0-3, forced only),
    ``pipe`` = shard_argmax_mma_pipe_kernel<T, NT, MT, WM, SK, KC, ST, MINB>
    (ids 4-15), ``tma`` = the same kernel with its weight tiles copied by TMA
    (``<..., MINB, true>``, ids 16-20: the twins of 4, 5, 13, 14, 15, the same
    sums; sm_90+ only, forced only: neither C++ auto nor :func:`mma_candidates`
    takes them, ``--tune`` times them beside their twins).
    tests/test_bench_predict.py checks this mirror against the header
    (parameters, shared memory, registers, kNumMmaVariants)."""

    id: int
    kind: str  # "reg" | "pipe" | "tma"
    nt: int  # 8-row n-tiles: 8 NT batch rows per pass
    kv: int = 0  # reg: 32-element k chunks per load step
    mt: int = 0  # pipe: 16-row m-tiles per warp
    wm: int = 0  # pipe: warps along the rows
    sk: int = 1  # pipe: split-K warp groups inside the tile
    kc: int = 0  # pipe: 32-element chunks per stage (= float32 partial sums per logit)
    st: int = 0  # pipe: shared-memory stages
    minb: int = 0  # pipe: __launch_bounds__ minimum blocks per SM

    @property
    def rows(self) -> int:
        return 128 if self.kind == "reg" else self.wm * self.mt * 16

    @property
    def threads(self) -> int:
        return 128 if self.kind == "reg" else self.wm * self.sk * 32

    @property
    def smem(self) -> int:
        """Shared memory per block (bytes), as the header's table gives it (MmaVariant::kSmem):
        reg: the static block_best; pipe: the stages (dynamic shared memory, :attr:`dynamic_smem`)
        + the static block_best."""
        if self.kind == "reg":
            return 4 * 8 * self.nt * 8
        return self.dynamic_smem + 8 * self.nt * self.wm * 8

    @property
    def dynamic_smem(self) -> int:
        """Dynamic shared memory the launch passes (pipe_stage_bytes: the stages; tma: + the ST
        8-byte mbarriers), 0 for reg."""
        if self.kind == "reg":
            return 0
        return self.st * self.kc * (self.rows + 8 * self.nt) * 64 + (8 * self.st if self.kind == "tma" else 0)

    @property
    def order(self) -> str:
        """The summation-order class (DESIGN.md rule 5): variants of one class give the same bits."""
        return "reg" if self.kind == "reg" else f"KC={self.kc}"

    @property
    def template(self) -> tuple:
        """The kernel's integer template parameters after T (the mangled name's integers; a
        pipe / tma kernel's bool TMA follows them: :attr:`kind`)."""
        if self.kind == "reg":
            return (self.nt, self.kv)
        return (self.nt, self.mt, self.wm, self.sk, self.kc, self.st, self.minb)

    @property
    def twin(self) -> int | None:
        """tma: the id of the cp.async variant with the same parameters (the same bits)."""
        if self.kind != "tma":
            return None
        return next(m.id for m in MMA_VARIANTS if m.kind == "pipe" and m.template == self.template)


MMA_VARIANTS = (
    MmaSpec(0, "reg", nt=1, kv=2),
    MmaSpec(1, "reg", nt=2, kv=2),
    MmaSpec(2, "reg", nt=4, kv=1),
    MmaSpec(3, "reg", nt=8, kv=1),
    MmaSpec(4, "pipe", nt=1, mt=2, wm=2, sk=1, kc=2, st=4, minb=6),
    MmaSpec(5, "pipe", nt=2, mt=2, wm=2, sk=1, kc=2, st=4, minb=5),
    MmaSpec(6, "pipe", nt=4, mt=2, wm=2, sk=1, kc=2, st=3, minb=6),
    MmaSpec(7, "pipe", nt=1, mt=2, wm=2, sk=2, kc=2, st=4, minb=4),
    MmaSpec(8, "pipe", nt=2, mt=2, wm=2, sk=2, kc=2, st=4, minb=4),
    MmaSpec(9, "pipe", nt=4, mt=2, wm=2, sk=2, kc=2, st=3, minb=4),
    MmaSpec(10, "pipe", nt=8, mt=2, wm=4, sk=1, kc=1, st=4, minb=3),
    MmaSpec(11, "pipe", nt=16, mt=1, wm=4, sk=1, kc=1, st=3, minb=4),
    MmaSpec(12, "pipe", nt=8, mt=2, wm=2, sk=1, kc=1, st=4, minb=6),
    MmaSpec(13, "pipe", nt=4, mt=2, wm=4, sk=1, kc=2, st=3, minb=3),
    MmaSpec(14, "pipe", nt=8, mt=4, wm=4, sk=1, kc=1, st=4, minb=2),
    MmaSpec(15, "pipe", nt=8, mt=3, wm=4, sk=1, kc=1, st=6, minb=2),
    MmaSpec(16, "tma", nt=1, mt=2, wm=2, sk=1, kc=2, st=4, minb=6),
    MmaSpec(17, "tma", nt=2, mt=2, wm=2, sk=1, kc=2, st=4, minb=5),
    MmaSpec(18, "tma", nt=4, mt=2, wm=4, sk=1, kc=2, st=3, minb=3),
    MmaSpec(19, "tma", nt=8, mt=4, wm=4, sk=1, kc=1, st=4, minb=2),
    MmaSpec(20, "tma", nt=8, mt=3, wm=4, sk=1, kc=1, st=6, minb=2),
)
"""The MmaVariant table by id (a mirror of the header; a test checks it)."""

DEFAULT_SM_COUNT = 132  # kDefaultSmCount
DEFAULT_SMEM_LIMIT = 227 * KiB  # kDefaultSmemLimit: opt-in shared memory per block (H100 / H200)


def cpp_mma_variant(
    num_valid: int, batch: int, sms: int = DEFAULT_SM_COUNT, smem_limit: int = DEFAULT_SMEM_LIMIT
) -> int:
    """choose_mma_variant (shard_argmax_launch.cuh): the id C++ runs for path
    ``"mma"`` / ``"auto"`` (small grid: fewer than 4 blocks of 64 rows per SM;
    at batch 33-64 256-row tiles where they give every SM a block, else
    192-row ones; never a variant whose shared memory exceeds ``smem_limit``)."""
    small_grid = -(-num_valid // 64) < 4 * sms

    def fits(vid: int) -> bool:
        return MMA_VARIANTS[vid].smem <= smem_limit

    if batch > 64:
        return 11
    if batch > 32:
        fills = -(-num_valid // 256) >= sms  # 256-row tiles give every SM a block
        if fills and fits(14):
            return 14
        if fits(15):
            return 15
        if fits(14):
            return 14
        return 12 if small_grid or not fits(10) else 10
    if batch > 16 and fits(13):
        return 13
    nt = 0 if batch <= 8 else 1 if batch <= 16 else 2
    return (7 if small_grid else 4) + nt


def _order_kc(batch: int) -> int:
    """KC of the summation-order class C++ auto runs at ``batch`` (2 up to 32, 1 past it)."""
    return 2 if batch <= 32 else 1


def mma_candidates(batch: int) -> tuple[int, ...]:
    """The pipelined variants a dispatch table may name at ``batch``: those of
    the summation-order class C++ ``auto`` runs there (KC = 2 up to batch 32,
    KC = 1 past it), so a table variant changes the speed, never the bits,
    against C++'s own choice (torch.compile, which cannot read the weight's
    alignment, passes ``"auto"``)."""
    return tuple(m.id for m in MMA_VARIANTS if m.kind == "pipe" and m.kc == _order_kc(batch))


def mma_tma_twins(batch: int) -> tuple[int, ...]:
    """The TMA variants of :func:`mma_candidates`' order class at ``batch`` (the twins of some
    of them): ``--tune`` times them beside the candidates, but no table cell names them (they
    run on sm_90+ only, and a table variant must run wherever the op takes the cell)."""
    return tuple(m.id for m in MMA_VARIANTS if m.kind == "tma" and m.kc == _order_kc(batch))


@dataclass(frozen=True)
class Variant:
    """One kernel instantiation: a CUDA path plus its template parameters.

    ``params`` are (name, value) pairs. Built kernels (``built=True``):
    ``simt`` ``nb`` (batch rows per pass), ``mma`` ``id`` (a row of
    :data:`MMA_VARIANTS`; named ``mma/<id>``, the op's path), ``gemm`` (none).
    Proposed ones (``built=False``, not in the .so): ``mma`` with ``stages``
    (shared-memory pipeline depth), ``tile_rows``, ``split_k``, ``tile_n``
    (batch rows per pass), ``pdl`` and ``fused_init`` (0/1: programmatic
    dependent launch, keys initialised without a separate zero-fill)."""

    path: str
    params: tuple = ()
    built: bool = True

    def get(self, name: str, default=None):
        return dict(self.params).get(name, default)

    @property
    def mma(self) -> MmaSpec | None:
        return MMA_VARIANTS[self.get("id")] if self.path == "mma" and self.built else None

    @property
    def name(self) -> str:
        if self.mma is not None:
            return f"mma/{self.mma.id}"
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.path}({inner})" if inner else self.path

    @property
    def op_path(self) -> str:
        """The ops' ``path`` value that runs this variant (simt: ``"simt"``, its NB follows the batch)."""
        return self.name if self.mma is not None else self.path


def variant(path: str, built: bool = True, **params) -> Variant:
    return Variant(path, tuple(params.items()), built)


def mma_variant(vid: int) -> Variant:
    return variant("mma", id=vid)


def todays_variant(path: str, batch: int, num_valid: int | None = None, sms: int = DEFAULT_SM_COUNT) -> Variant:
    """The instantiation the launcher runs for ``path`` at ``batch``
    (csrc/cuda/shard_argmax_launch.cuh: launch_simt's NB; launch_mma's
    choose_mma_variant, whose grid-size choice needs ``num_valid``: a large
    grid when not given). ``"mma/<id>"`` is that variant."""
    if path == "simt":
        return variant("simt", nb=1 if batch <= 1 else 2 if batch <= 2 else 4 if batch <= 4 else 8)
    if path == "mma":
        return mma_variant(cpp_mma_variant(num_valid if num_valid is not None else 1 << 30, batch, sms))
    if path.startswith("mma/") and path[4:].isdigit() and int(path[4:]) < len(MMA_VARIANTS):
        return mma_variant(int(path[4:]))
    if path == "gemm":
        return variant("gemm")
    raise ValueError(f"unknown CUDA path {path!r}")


def reg_variant(batch: int) -> Variant:
    """The register-double-buffered kernel (ids 0-3) sized for ``batch``: what
    C++ auto ran before the pipelined kernel (the review's table describes it)."""
    return mma_variant(0 if batch <= 8 else 1 if batch <= 16 else 2 if batch <= 32 else 3)


def cpp_auto_path(batch: int, gemm_min_batch: int | None = None, rows: int | None = None, sms: int = 132) -> str:
    """C++ ``path="auto"``'s choice for bf16 / fp16 argmax on sm_80+ with
    aligned inputs (pick_path in csrc/cuda): gemm from its gemm batch, simt
    at small batches on small shards (``rows`` = weight.size(0), when the
    rule is on), else mma."""
    gemm_min_batch = CPP_GEMM_MIN_BATCH if gemm_min_batch is None else gemm_min_batch
    if batch >= gemm_min_batch:
        return "gemm"
    if rows is not None and batch <= CPP_SIMT_MAX_BATCH and rows < CPP_SIMT_MAX_ROWS_PER_SM * sms:
        return "simt"
    return "mma"


# Registers per thread on sm_90a (bf16): the fallback when no CUDA build can be read. mma: the
# MmaVariant table's column (shard_argmax_launch.cuh, "regs 90a/80", as built; a test checks it);
# simt: ptxas for sm_90a of the same build (nvcc 13.0; the review's §2.1 said 54 / 61 at NB = 1 / 8).
DEFAULT_REGISTERS = {
    "mma/0": 150,
    "mma/1": 150,
    "mma/2": 128,
    "mma/3": 214,
    "mma/4": 109,
    "mma/5": 126,
    "mma/6": 162,
    "mma/7": 88,
    "mma/8": 82,
    "mma/9": 90,
    "mma/10": 146,
    "mma/11": 126,
    "mma/12": 146,
    "mma/13": 162,
    "mma/14": 242,
    "mma/15": 206,
    "mma/16": 108,
    "mma/17": 124,
    "mma/18": 160,
    "mma/19": 240,
    "mma/20": 204,
    "simt(nb=1)": 54,
    "simt(nb=2)": 48,
    "simt(nb=4)": 47,
    "simt(nb=8)": 62,
}


@dataclass
class Registers:
    """Registers per thread by variant name, and where they came from."""

    by_variant: dict
    source: str

    def of(self, v: Variant) -> tuple[int, str]:
        if v.name in self.by_variant:
            return self.by_variant[v.name], self.source
        if not v.built:
            return _estimated_registers(v), "estimated (proposed variant: 40 + fp32 accumulators per thread)"
        return DEFAULT_REGISTERS.get(v.name, 64), "default (sm_90a as built)"


_MMA_NAME = re.compile(r"shard_argmax_mma_kernelI(?:13__nv_bfloat16|6__half)Li(\d+)ELi(\d+)E")
_PIPE_NAME = re.compile(r"shard_argmax_mma_pipe_kernelI(?:13__nv_bfloat16|6__half)((?:Li\d+E){7})(?:Lb([01])E)?")
_SIMT_NAME = re.compile(r"shard_argmax_kernelI13__nv_bfloat16Li(\d+)ELi8ELb0ELb0E")  # <T, NB, kVec, TOPK, LSE>: argmax
_MMA_BY_TEMPLATE = {(m.template, m.kind == "tma"): m.id for m in MMA_VARIANTS}  # (integers, TMA)


def parse_registers(text: str, arch: str = "sm_90") -> dict:
    """``{variant name: registers}`` of the bf16 argmax kernels of ``arch``
    (sm_90 also matches sm_90a) from ``cuobjdump --dump-resource-usage``
    output (``arch = sm_90a`` ... ``Function <mangled>: REG:150 ...``) or the
    ptxas lines of a build log (``Compiling entry function '<mangled>' for
    'sm_90a'`` then ``Used 150 registers``). mma kernels are named by their
    MmaVariant id (``mma/7``); their fp16 and bf16 builds are listed
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
    template = (tuple(int(x) for x in re.findall(r"Li(\d+)E", m.group(1))), m.group(2) == "1") if m else None
    if m is None:
        m = _MMA_NAME.search(mangled)
        template = ((int(m.group(1)), int(m.group(2))), False) if m else None
    if m is not None:
        vid = _MMA_BY_TEMPLATE.get(template)
        if vid is not None and ("bfloat16" in mangled or f"mma/{vid}" not in out):
            out[f"mma/{vid}"] = regs
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
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    tool = _cuobjdump()
    for so in sorted(glob.glob(str(root / "localargmax" / "_C*.so"))):
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
        "defaults: no CUDA build to read (sm_90a as built: mma the MmaVariant table's column, simt ptxas)",
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


def _estimated_registers(v: Variant) -> int:
    threads = 32 * v.get("warps", 4)
    return min(255, 40 + math.ceil(v.get("tile_rows", 128) * v.get("tile_n", 8) / threads))


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
    """The launch of the Little's-law variants (simt, mma today and proposed)."""
    fixed = spec.launch_s * (0.25 if v.get("pdl") else 1.0) + (0.0 if v.get("fused_init") else spec.zero_fill_s)
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
    m = v.mma
    if m is not None and m.kind in ("pipe", "tma"):
        return _pipe_geometry(spec, m, rows, hidden, batch, elem)
    instructions = 0.0
    if m is not None:  # reg (ids 0-3): 4 warps x 32 rows, register double buffer, KV x 2 KiB per warp in flight
        tile_rows, tile_n, warps, split_k, stages = 128, 8 * m.nt, 4, 1, 1
        in_flight = warps * m.kv * 32 * 32 * elem
        smem = m.smem
        fixed = spec.launch_s + spec.zero_fill_s  # launched plainly (no PDL)
    else:
        tile_rows, tile_n = v.get("tile_rows", 128), v.get("tile_n", 64)
        warps, split_k, stages = v.get("warps", 4), v.get("split_k", 1), v.get("stages", 3)
        k_tile = v.get("k_tile", 64)
        in_flight = (stages - 1) * tile_rows * k_tile * elem
        smem = stages * (tile_rows + tile_n) * k_tile * elem + warps * tile_n * 8
    tiles, passes = -(-rows // tile_rows), -(-batch // tile_n)
    cta_bytes = rows * hidden * elem / (tiles * split_k)
    return Geometry(
        ctas=tiles * passes * split_k,
        threads=32 * warps,
        smem=smem,
        cta_bytes=cta_bytes,
        cta_l2_bytes=min(tile_n, batch) * hidden * elem / split_k,
        cta_in_flight=in_flight,
        cta_serial_s=(2 * spec.latency_s if split_k > 1 else 0.0),  # cluster / DSMEM reduction of the partials
        cta_instructions=instructions,
        cta_flops=2.0 * tile_rows * tile_n * hidden / split_k,
        passes=passes,
        fixed_s=fixed,
    )


# Warp-instructions of the pipelined kernel, per warp and 32-element k chunk (shard_argmax_mma_kernel.cuh):
# MT x NT x 2 mma.sync (m16n8k16), 2 shared loads per m-tile and 1 per n-tile (16 bytes per lane and row),
# and PIPE_COPY_INSTRUCTIONS per 16-byte cp.async a thread issues (address math, predicate, LDGSTS); plus
# PIPE_STEP_INSTRUCTIONS per warp and pipeline step (wait, barrier, commit, loop). Estimates from the
# kernel text, not from SASS.
PIPE_COPY_INSTRUCTIONS = 4
PIPE_STEP_INSTRUCTIONS = 12
# The TMA variants (kind "tma") copy only the hidden rows by cp.async; the weight of a step is KC
# bulk tensor copies that one thread issues (coordinates, UTMALDG: PIPE_TMA_BOX_INSTRUCTIONS
# per box, in one warp) after a proxy fence and the mbarrier's arrive.expect_tx, and every warp
# waits on the stage's mbarrier (try_wait, parity): PIPE_TMA_STEP_INSTRUCTIONS per warp and step
# on top of PIPE_STEP_INSTRUCTIONS. Estimates from the kernel text, not from SASS.
PIPE_TMA_BOX_INSTRUCTIONS = 6
PIPE_TMA_STEP_INSTRUCTIONS = 4


def _pipe_geometry(spec: DeviceSpec, m: MmaSpec, rows: int, hidden: int, batch: int, elem: int) -> Geometry:
    """shard_argmax_mma_pipe_kernel (ids 4-20): a CTA owns ``m.rows`` weight rows and ``8 NT`` batch rows
    (further rows: more passes, grid y); ST stages of KC chunks of (rows + 8 NT) x 64 bytes; the
    weight of ST - 1 steps in flight; SK warp groups split each step's chunks (partials added through
    shared memory at the end: no extra CTAs); launched with PDL (sm_90+), after the keys' zero fill."""
    tiles, passes = -(-rows // m.rows), -(-batch // (8 * m.nt))
    warps = m.threads // 32
    chunks = -(-hidden // 32)
    steps = -(-chunks // m.kc)
    tma = m.kind == "tma"  # the weight by bulk tensor copy: only the hidden rows by cp.async
    copies = ((0 if tma else m.rows) + 8 * m.nt) * 64 * m.kc / 16 / 32  # warp-wide 16-byte cp.async per step
    per_chunk = m.mt * m.nt * 2 + 2 * m.mt + m.nt  # per computing warp: mma + shared loads
    per_step = copies * PIPE_COPY_INSTRUCTIONS + warps * PIPE_STEP_INSTRUCTIONS
    if tma:
        per_step += m.kc * PIPE_TMA_BOX_INSTRUCTIONS + warps * PIPE_TMA_STEP_INSTRUCTIONS
    instructions = chunks * m.wm * per_chunk + steps * per_step
    return Geometry(
        ctas=tiles * passes,
        threads=m.threads,
        smem=m.smem,
        cta_bytes=rows * hidden * elem / tiles,
        cta_l2_bytes=min(8 * m.nt, batch) * hidden * elem,
        cta_in_flight=(m.st - 1) * m.kc * m.rows * 32 * elem,
        cta_serial_s=0.0,
        cta_instructions=instructions,
        cta_flops=2.0 * m.rows * 8 * m.nt * hidden,
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
    chunk = max(1, (1024 * MiB) // 4 // padded)  # csrc/cuda/shard_argmax_gemm.cu
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


# --- engine shapes, candidates and the proposed variants ----------------------------------------------------


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
    from ..layout import shard_vocab

    vocab, hidden = PRESET_SHAPES[model]
    shard = shard_vocab(vocab, 0, tp, pad_to=64)
    return EngineShape(model, tp, vocab, hidden, shard.num_valid, shard.rows)


def engine_shapes(pairs: Iterable[tuple[str, int]] = ENGINE_SHAPES) -> list[EngineShape]:
    return [engine_shape(m, tp) for m, tp in pairs]


def built_candidates(batch: int) -> list[Variant]:
    """What a dispatch table can choose at ``batch``: simt's instantiation, the
    pipelined mma variants of :func:`mma_candidates`, gemm."""
    return [todays_variant("simt", batch), *(mma_variant(i) for i in mma_candidates(batch)), variant("gemm")]


def proposed_variants(batch: int) -> list[Variant]:
    """The proposed pipelined mma kernel's search space at ``batch``: stages
    2/3/4, 64/128/256-row tiles, split-K 1/2/4, with and without PDL + fused
    init; ``tile_n`` = the batch rounded up to 8..128 (one pass up to 128)."""
    tile_n = min(128, max(8, 1 << max(0, batch - 1).bit_length()))
    out = []
    for fixed in (0, 1):
        for stages in (2, 3, 4):
            for tile_rows in (64, 128, 256):
                for split_k in (1, 2, 4):
                    warps = 8 if tile_rows == 256 else 4
                    out.append(
                        variant(
                            "mma",
                            built=False,
                            stages=stages,
                            tile_rows=tile_rows,
                            split_k=split_k,
                            tile_n=tile_n,
                            warps=warps,
                            pdl=fixed,
                            fused_init=fixed,
                        )
                    )
    return out


def best(spec, variants, rows, hidden, batch, registers=None, latency_s=None) -> Prediction:
    preds = [_try(spec, v, rows, hidden, batch, registers, latency_s) for v in variants]
    return min((p for p in preds if p is not None), key=lambda p: p.time_s)


def smallest_meeting_bar(spec, rows, hidden, batch, registers=None, latency_s=None, bar=BAR_FRACTION):
    """The cheapest proposed variant (fewest stages, then no PDL, smallest
    split-K, then fastest) predicted at >= ``bar`` of copy; None if none is."""
    ok = [
        p
        for v in proposed_variants(batch)
        if (p := _try(spec, v, rows, hidden, batch, registers, latency_s)) is not None and p.fraction_of_copy >= bar
    ]
    key = lambda p: (p.variant.get("pdl"), p.variant.get("stages"), p.variant.get("split_k"), p.time_s)  # noqa: E731
    return min(ok, key=key) if ok else None


def _try(spec, v, rows, hidden, batch, registers, latency_s):
    try:
        return predict(spec, v, rows, hidden, batch, registers=registers, latency_s=latency_s)
    except ValueError:
        return None


def model_sha256() -> str:
    """sha256 (first 16 hex digits) of this file: the table records it."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def with_latency(spec: DeviceSpec, latency_s: float) -> DeviceSpec:
    return replace(spec, latency_s=latency_s)


# --- C++ auto's defaults (csrc/cuda/shard_argmax_cuda.cu), from the model ------------------------------------

DEFAULTS_BATCHES = range(1, 257)


def cpp_defaults(spec: DeviceSpec = H200, registers: Registers | None = None, hysteresis: float = 1.03) -> dict:
    """The C++ ``auto`` constants the model gives for the pipelined kernel on the engine shapes
    (kDefaultGemmMinBatch, kSimtMaxBatch, kSimtMaxRowsPerSm; dispatch.CPP_* mirror them):

    * ``gemm_min_batch``: the batch threshold (gemm from it, choose_mma_variant's mma below it)
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
