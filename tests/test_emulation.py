"""The CUDA kernels' own source, run on the CPU by the host SIMT emulation
(csrc/emu/, driven by tests/support/emulation.py): every kernel family and every
template instantiation the launchers pick, on shapes covering the tails, the
grid-y loop, padding rows, empty shards, ties across blocks and NaN / -0.0 /
-inf rows. Each launch runs with checked global memory, poisoned shared memory
and the shared-memory race check. Needs g++ and objcopy only (no nvcc, no GPU).

Oracles: on exact-integer problems (every dot product exact in float32) the
keys must equal the CPU kernel's bit for bit, for argmax, top-k and sampling;
on random float problems the ids must equal the float64 reference's wherever
the top-2 gap exceeds the float32 accumulation bound, and the values must be
within that bound.
"""

from __future__ import annotations

import math
import pathlib
import re
import subprocess

import pytest
import torch

import localargmax  # noqa: F401  (registers torch.ops.localargmax)
from localargmax.reference import reference_logits
from tests.support import emulation
from tests.support.emulation import CSRC, Emulator
from tests.support.reference import check_against_reference, error_bound

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")

ops = torch.ops.localargmax
HALF = (torch.bfloat16, torch.float16)
ALL = (torch.float32, *HALF)


@pytest.fixture(scope="module")
def emu() -> Emulator:
    return Emulator(emulation.build())


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
    if k is not None:
        return ops.shard_topk(h, w, b, vocab_start, num_valid, k)
    if temperature is not None:
        return ops.shard_sample(h, w, b, vocab_start, num_valid, temperature, seed, offset)
    return ops.shard_argmax(h, w, b, vocab_start, num_valid)


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


# --- every instantiation, and the same kernel text in both builds ---


# MmaVariant 4..15 of shard_argmax_launch.cuh: (NT, MT, WM, SK, KC, ST, MINB).
PIPE_VARIANTS = [
    (1, 2, 2, 1, 2, 4, 6),
    (2, 2, 2, 1, 2, 4, 5),
    (4, 2, 2, 1, 2, 3, 6),
    (1, 2, 2, 2, 2, 4, 4),
    (2, 2, 2, 2, 2, 4, 4),
    (4, 2, 2, 2, 2, 3, 4),
    (8, 2, 4, 1, 1, 4, 3),
    (16, 1, 4, 1, 1, 3, 4),
    (8, 2, 2, 1, 1, 4, 6),
    (4, 2, 4, 1, 2, 3, 3),
    (8, 4, 4, 1, 1, 4, 2),
    (8, 3, 4, 1, 1, 6, 2),
]
# MmaVariant 16..20: the TMA twins of 4, 5, 13, 14, 15 (shard_argmax_mma_pipe_kernel<..., MINB, true>).
TMA_TWINS = {16: 4, 17: 5, 18: 13, 19: 14, 20: 15}
MMA_VARIANTS = [f"mma/{v}" for v in range(emulation.NUM_MMA_VARIANTS)]
# Variants that sum in the same order (same NT class and KC): bit-identical keys; each TMA
# variant with its cp.async twin (the copy mechanism differs, not the data or the order).
SAME_ORDER = [(4, 7), (5, 8), (6, 9), (10, 12), (6, 13), (10, 14), (10, 15)] + [
    (twin, tma) for tma, twin in TMA_TWINS.items()
]


def _instantiations():
    names = []
    for t, vec in (("float", 4), ("__nv_bfloat16", 8), ("__half", 8)):
        for nb in (1, 2, 4, 8):
            for v in (vec, 1):
                for topk in ("false", "true"):
                    names.append(f"shard_argmax_kernel<{t}, {nb}, {v}, {topk}>")
                    names.append(f"shard_argmax_kernel<{t}, {nb}, {v}, {topk}, true>")  # LSE: the *_lse ops
        if t != "float":
            names += [f"shard_argmax_mma_kernel<{t}, {nt}, {kv}>" for nt, kv in ((1, 2), (2, 2), (4, 1), (8, 1))]
            # <..., MINB, TMA>: the cp.async variants, then their TMA twins
            names += [f"shard_argmax_mma_pipe_kernel<{t}, {', '.join(map(str, v))}, false>" for v in PIPE_VARIANTS]
            names += [
                f"shard_argmax_mma_pipe_kernel<{t}, {', '.join(map(str, PIPE_VARIANTS[twin - 4]))}, true>"
                for twin in TMA_TWINS.values()
            ]
            names.append(f"logits_to_keys_kernel<{t}>")
            names.append(f"logits_to_keys_kernel<{t}, true>")
    return names + ["merge_keys_kernel", "merge_partition_kernel"]


def test_every_instantiation_the_launchers_pick_runs(emu, gen):
    """Batch sizes at every NB / NT boundary, vector and scalar loads, top-k
    and argmax, each dtype: the launch choices of shard_argmax_launch.cuh reach
    every instantiation, and each one runs checked."""
    emu.launched.clear()
    for dtype in ALL:
        for batch in (1, 2, 3, 5, 9, 17, 33):
            for hidden_size in (8, 9):  # 9: scalar loads (simt) / not taken (mma)
                h, w, _ = exact_problem(gen, batch, 3, hidden_size, dtype)
                want = cpu_keys(h, w, None, 0, 3)
                assert_keys_equal(emu.shard(h, w), want, f"simt {dtype} B={batch} H={hidden_size}")
                assert_keys_equal(emu.shard(h, w, k=2), cpu_keys(h, w, None, 0, 3, k=2), "topk")
                assert_keys_equal(emu.shard(h, w, log_partition=True)[0], want, "argmax with log-partition")
                assert_keys_equal(emu.shard(h, w, k=2, log_partition=True)[0], cpu_keys(h, w, None, 0, 3, k=2), "")
                if dtype in HALF and hidden_size == 8:
                    assert_keys_equal(emu.shard(h, w, path="gemm"), want, f"gemm {dtype} B={batch}")
                    assert_keys_equal(emu.shard(h, w, path="gemm", log_partition=True)[0], want, "gemm, lse")
    # mma: auto's choices at every NT boundary, split (few blocks per SM) or not, with the
    # dynamic-shared-memory variants, with 10 (50 KiB) but not 13 / 14, or (48 KiB opt-in limit)
    # with none of them; then every other
    # variant of the table forced (the register-double-buffered kernel is forced only).
    auto = set()
    for dtype in HALF:
        for batch in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129):
            h, w, _ = exact_problem(gen, batch, 300, 8, dtype)
            want = cpu_keys(h, w, None, 0, 300)
            # 5 tiles of 64 rows: >= 4 per SM on 1 SM; on 132 a small grid (split K, 64-row tiles at NT = 8)
            for sm_count in (1, 132):
                for limit in (emulation.DEFAULT_SMEM_LIMIT, 56 * 1024, 48 * 1024):
                    auto.add(emu.mma_variant(8, 300, batch, sm_count, limit))
                    got = emu.shard(h, w, path="mma", sm_count=sm_count, smem_limit=limit)
                    assert_keys_equal(got, want, f"mma {dtype} B={batch}")
        for v in range(emulation.NUM_MMA_VARIANTS):
            h, w, _ = exact_problem(gen, 3, 3, 8, dtype)
            assert_keys_equal(emu.shard(h, w, path=f"mma/{v}"), cpu_keys(h, w, None, 0, 3), f"mma/{v} {dtype}")
    # auto: every pipelined cp.async variant, never a TMA one (sm_90+ only; a GPU --tune decides)
    assert auto == {v for v in range(4, emulation.NUM_MMA_VARIANTS) if v not in TMA_TWINS}, auto
    keys = torch.stack([ops.shard_argmax(*exact_problem(gen, 4, 5, 8, torch.float32)[:2], None, 0, 5)])
    emu.merge_keys(keys)
    assert set(_instantiations()) == set(emu.launched), set(_instantiations()) ^ set(emu.launched)


def test_tma_variants_are_forced_only_twins(emu):
    """Ids 16-20 copy the weight by TMA (the header's kTma; the model's kind "tma"), each the twin of
    a cp.async variant with the same parameters (so the same sums); their dynamic shared memory is
    the twin's plus ST 8-byte mbarriers; auto never picks them (test above) nor does a dispatch
    table (predict.mma_candidates)."""
    from localargmax.bench import predict as pm

    for v in range(emulation.NUM_MMA_VARIANTS):
        m = pm.MMA_VARIANTS[v]
        assert emu.mma_variant_tma(v) == (v in TMA_TWINS) == (m.kind == "tma"), v
        if v in TMA_TWINS:
            twin = pm.MMA_VARIANTS[TMA_TWINS[v]]
            assert m.twin == twin.id and m.template == twin.template and m.order == twin.order
            assert emu.mma_variant_smem(v) == twin.smem + 8 * m.st
            assert all(v not in pm.mma_candidates(b) for b in (1, 16, 32, 33, 64, 128))
            assert v in pm.mma_tma_twins(8 if m.kc == 2 else 64)
    assert not emu.mma_variant_tma(emulation.NUM_MMA_VARIANTS)


def _split_device_host(body: str) -> tuple[str, str]:
    """The two branches of mma_sync.cuh's outer `#if defined(__CUDACC__)`."""
    rest = body.split("#if defined(__CUDACC__)\n", 1)[1]
    at = rest.index("\n#else\ninline")
    return rest[:at], rest[at:]


def test_host_and_cuda_builds_compile_the_same_kernel_text(emu):
    kernel_headers = sorted((CSRC / "cuda").glob("*.cuh"))
    switches = {"device_runtime.cuh", "mma_sync.cuh"}  # the only files that may tell the compilers apart
    for f in kernel_headers:
        if f.name in switches:
            continue
        conditionals = [ln for ln in f.read_text().splitlines() if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)", ln)]
        assert not conditionals, (
            f"{f.name} holds preprocessor switches {conditionals}: the host emulation and nvcc "
            "could compile different kernel text"
        )
    # mma_sync.cuh: the asm under nvcc, the emulation on the host: mma.sync one switch per dtype;
    # the cp.async and griddepcontrol wrappers defined once per compiler, each with a host twin.
    body = (CSRC / "cuda" / "mma_sync.cuh").read_text()
    assert body.count("emu::mma_m16n8k16(") == 2
    device, host = _split_device_host(body)
    wrappers = ("cp_async16", "cp_async_commit", "cp_async_wait", "grid_dependency_wait", "allow_dependent_launch")
    # ... and the TMA variants' mbarrier, proxy fence and bulk tensor copy
    wrappers += ("mbarrier_init", "mbarrier_init_fence", "mbarrier_arrive_expect_tx", "mbarrier_wait_parity")
    wrappers += ("fence_proxy_async_shared", "tma_load_2d")
    for name in wrappers:
        assert re.search(rf"__device__ __forceinline__ void {name}\(", device), name
        assert re.search(rf"inline void {name}\(", host), name
    assert "emu::cp_async(" in host and "emu::cp_async_wait(" in host and "emu::cp_async_commit(" in host
    assert all(f"emu::{f}(" in host for f in ("mbarrier_init", "mbarrier_wait_parity", "tma_load_2d"))
    # The emulation translation unit reads every kernel header from csrc/cuda itself (no copy) ...
    deps = subprocess.run(
        ["g++", "-std=c++20", f"-I{CSRC}", "-MM", str(CSRC / "emu" / "emu_kernels.cpp")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    used = {pathlib.Path(p).resolve() for p in re.findall(r"\S+\.cuh", deps)}
    assert all(p.parent == (CSRC / "cuda").resolve() for p in used), used
    used = {p.name for p in used}
    assert used == {f.name for f in kernel_headers}, used ^ {f.name for f in kernel_headers}
    # ... and the CUDA translation units include the same kernel headers.
    cu_includes = set()
    for cu in (CSRC / "cuda").glob("*.cu"):
        cu_includes |= set(re.findall(r'#include "(\w+\.cuh)"', cu.read_text()))
    assert cu_includes and cu_includes <= used
    # Kernels are defined in csrc/cuda only.
    for f in [*(CSRC / "emu").glob("*"), *(CSRC.parent / "tests" / "cpp").glob("*")]:
        assert not re.search(r"__global__\s+void", f.read_text()), f"a kernel defined in {f}"
    # The kernel object's shared-memory section holds the kernels' __shared__ arrays and nothing else.
    syms = subprocess.run(["nm", "-C", str(emu.path)], capture_output=True, text=True, check=True).stdout
    addr = {m[1]: int(m[0], 16) for m in re.findall(r"^([0-9a-f]+) \w (__(?:start|stop)_lam_emu_shared)$", syms, re.M)}
    lo, hi = addr["__start_lam_emu_shared"], addr["__stop_lam_emu_shared"]
    assert hi - lo == emu.stats()["shared_bytes"] > 0
    inside = [
        ln
        for ln in syms.splitlines()
        if re.match(r"[0-9a-f]+ ", ln) and lo <= int(ln.split()[0], 16) < hi and "lam_emu_shared" not in ln
    ]
    assert inside and all(
        re.search(r"_kernel<.*>\(.*\)::(block_best|candidates|lists|warp_best|stages|warp_partition)$", ln)
        for ln in inside
    ), inside


# --- argmax on every path, exact problems: keys bit-equal to the CPU kernel's ---

SIMT = [
    (1, 1, 8),
    (2, 65, 16),
    (3, 130, 24),
    (4, 300, 40),
    (5, 63, 7),
    (8, 129, 4104),
    (9, 64, 33),
    (17, 127, 1),
    (130, 70, 16),
]
MMA = [
    (1, 1, 8),
    (8, 129, 16),
    (9, 65, 24),
    (16, 300, 40),
    (17, 127, 8),
    (32, 64, 4104),
    (33, 129, 40),
    (64, 65, 16),
    (65, 130, 24),
    (128, 70, 8),
    (130, 3, 16),
]
GEMM = [(1, 1, 8), (7, 300, 40), (130, 129, 4104)]


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("batch,rows,hidden_size", SIMT)
def test_simt_argmax(emu, gen, dtype, batch, rows, hidden_size):
    bias = (None, "f", "t")[batch % 3] if dtype in HALF else (None, "t")[batch % 2]
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, bias)
    vocab_start = 1000 * (rows % 3)
    got = emu.shard(h, w, b, vocab_start, rows, path="simt")
    assert_keys_equal(got, cpu_keys(h, w, b, vocab_start, rows), "simt")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("batch,rows,hidden_size", MMA)
def test_mma_argmax(emu, gen, dtype, batch, rows, hidden_size):
    bias = (None, "f", "t")[batch % 3]
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, bias)
    got = emu.shard(h, w, b, 77, rows, path="mma")
    assert_keys_equal(got, cpu_keys(h, w, b, 77, rows), "mma")


# Every variant: row tails (rows % 64, % 128), k tails (H not a multiple of a
# stage's KC * 32 elements, fewer steps than stages, H = 4104 many steps),
# batch 1..128 and past a variant's pass (grid y).
VARIANT_SHAPES = [
    (1, 1, 8),
    (7, 65, 40),
    (16, 129, 104),
    (23, 300, 264),
    (40, 64, 8),
    (64, 200, 4104),
    (100, 127, 72),
    (128, 130, 24),
    (129, 3, 16),
]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("path", MMA_VARIANTS)
def test_every_mma_variant_against_the_cpu_kernel(emu, gen, dtype, path):
    for i, (batch, rows, hidden_size) in enumerate(VARIANT_SHAPES):
        h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, (None, "f", "t")[i % 3])
        got = emu.shard(h, w, b, 77, rows, path=path)
        assert_keys_equal(got, cpu_keys(h, w, b, 77, rows), f"{path} B={batch} rows={rows} H={hidden_size}")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("pair", SAME_ORDER, ids=str)
def test_identical_rows_give_identical_bits_in_every_place_and_variant(emu, gen, dtype, pair):
    """Rule 5 on random floats (inexact sums): a weight row copied to rows in
    other warps, m-tiles and tiles, and a hidden row copied to other batch
    positions, give bit-identical keys (value bits) wherever they sit; the
    variants of one summation order (split-K or not, a choice by grid size)
    and shards cut at another row (another num_valid / vocab_start) agree bit for bit."""
    batch = {4: 8, 5: 16, 6: 32, 10: 64, 13: 32, 14: 64, 15: 64}[pair[0]]
    rows, hidden_size = 300, 264
    h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
    w = (torch.randn(rows, hidden_size, generator=gen)).to(dtype)
    for r in (17, 40, 63, 64, 150, 299):
        w[r] = w[5]
    for b in range(1, batch, 3):
        h[b] = h[0]
    keys = {v: emu.shard(h, w, None, 0, rows, path=f"mma/{v}") for v in pair}
    assert torch.equal(keys[pair[0]], keys[pair[1]])
    for v in pair:  # same values for the duplicated hidden rows; ties to the smallest index
        got = keys[v]
        assert (got[1::3] == got[0]).all()
        # against float64 with the float32 error bound; the copies of row 5 tie it exactly, so only
        # row 5 may win for them (rule 1): their columns are taken out of the reference
        logits = reference_logits(h, w)
        logits[:, [17, 40, 63, 64, 150, 299]] = -math.inf
        reference = (logits, error_bound(h, w))
        check_against_reference(decode(got), h, w, min_clear_fraction=0.5, reference=reference, context=f"mma/{v}")
        # the value of row 5 and of its copies, as winners: plant them as the winners via a bias
        bias = torch.full((rows,), -1e4)
        bias[[5, 17, 40, 63, 64, 150, 299]] = 0.0
        won = emu.shard(h, w, bias, 0, rows, path=f"mma/{v}")
        assert (decode(won) == 5).all()
        later = emu.shard(h, w[6:], bias[6:], 6, rows - 6, path=f"mma/{v}")  # row 5 cut away: copy 17 wins
        assert (decode(later) == 17).all() and torch.equal(later >> 32, won >> 32)


# Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin): H100 / H200, A100, sm_86 / sm_89,
# and the 48 KiB without opt-in.
SMEM_LIMITS = (227 * 1024, 163 * 1024, 99 * 1024, 48 * 1024)


@pytest.mark.parametrize("smem_limit", SMEM_LIMITS)
def test_auto_never_picks_a_variant_past_the_shared_memory_limit(emu, gen, smem_limit):
    """choose_mma_variant under the device's opt-in limit: the variant it picks fits, sums in the
    order class of the batch (KC = 2 up to 32, KC = 1 past it) whatever the limit, and gives the
    bits of the unlimited choice."""
    from localargmax.bench import predict as pm

    for batch in (1, 9, 17, 32, 33, 64, 65):
        for num_valid in (300, 151936):
            for sm_count in (1, 132):
                vid = emu.mma_variant(4096, num_valid, batch, sm_count, smem_limit)
                assert 0 < emu.mma_variant_smem(vid) <= smem_limit, (vid, smem_limit)
                unlimited = emu.mma_variant(4096, num_valid, batch, sm_count)
                assert pm.MMA_VARIANTS[vid].order == pm.MMA_VARIANTS[unlimited].order
                assert pm.cpp_mma_variant(num_valid, batch, sm_count, smem_limit) == vid
    h = torch.randn(40, 264, generator=gen).to(torch.bfloat16)
    w = torch.randn(300, 264, generator=gen).to(torch.bfloat16)
    assert torch.equal(emu.shard(h, w, path="mma", smem_limit=smem_limit), emu.shard(h, w, path="mma"))


def test_forced_variant_past_the_shared_memory_limit_raises(emu, gen):
    """path="mma/<id>" whose shared memory exceeds the device's opt-in limit: ValueError naming the
    variant, its bytes and the limit (run_mma's TORCH_CHECK_VALUE); the header's bytes = the model's."""
    from localargmax.bench import predict as pm

    h, w, _ = exact_problem(gen, 3, 3, 8, torch.bfloat16)
    for m in pm.MMA_VARIANTS:
        assert emu.mma_variant_smem(m.id) == m.smem, m
    assert emu.mma_variant_smem(emulation.NUM_MMA_VARIANTS) == -1
    big = max(pm.MMA_VARIANTS, key=lambda m: m.smem)
    assert big.smem > 48 * 1024
    with pytest.raises(ValueError, match=rf"path='mma/{big.id}' needs {big.smem} bytes .* allows {48 * 1024}"):
        emu.shard(h, w, path=f"mma/{big.id}", smem_limit=48 * 1024)
    assert_keys_equal(emu.shard(h, w, path=f"mma/{big.id}", smem_limit=big.smem), cpu_keys(h, w, None, 0, 3), "fits")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("batch,rows,hidden_size", GEMM)
def test_gemm_keys(emu, gen, dtype, batch, rows, hidden_size):
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, (None, "f", "t")[batch % 3])
    got = emu.shard(h, w, b, 5, rows, path="gemm", gemm_chunk=50)  # chunks of 50 batch rows: b0 > 0
    assert_keys_equal(got, cpu_keys(h, w, b, 5, rows), "gemm")


# --- top-k and sampling ---


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize(
    "batch,rows,hidden_size,k", [(1, 300, 40, 64), (3, 129, 4104, 5), (9, 65, 7, 1), (17, 200, 16, 64)]
)
def test_simt_topk_in_torch_topk_order(emu, gen, dtype, batch, rows, hidden_size, k):
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "t")
    got = emu.shard(h, w, b, 3, rows, k=k)
    assert_keys_equal(got, cpu_keys(h, w, b, 3, rows, k=k), "topk")
    logits = reference_logits(h, w, b)
    kept = min(k, rows)
    want = torch.topk(logits, kept, dim=1)
    _, values = localargmax.decode_keys(got[:, :kept])
    assert torch.equal(values.double(), want.values)
    ids = decode(got[:, :kept]) - 3
    assert torch.equal(logits.gather(1, ids), want.values)
    assert (got[:, kept:] == 0).all()  # empty slots


@pytest.mark.parametrize(
    "path,dtype",
    [
        ("simt", torch.float32),
        ("simt", torch.bfloat16),
        ("mma", torch.float16),
        ("mma", torch.bfloat16),
        ("gemm", torch.bfloat16),
        ("mma/0", torch.float16),
        ("mma/4", torch.bfloat16),
        ("mma/7", torch.float16),
        ("mma/10", torch.bfloat16),
        ("mma/11", torch.float16),
    ],
)
@pytest.mark.parametrize("batch,rows,hidden_size", [(5, 300, 40), (33, 129, 16)])
def test_sample_equals_cpu_draws(emu, gen, path, dtype, batch, rows, hidden_size):
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 7.0] * 6)[:batch]
    seed, offset = int(torch.randint(0, 2**62, (1,), generator=gen)), 11
    got = emu.shard(h, w, b, 64, rows, path=path, temperature=temperature, seed=seed, offset=offset)
    assert_keys_equal(got, cpu_keys(h, w, b, 64, rows, temperature=temperature, seed=seed, offset=offset), path)


@pytest.mark.parametrize("path,dtype", [("simt", torch.float32), ("mma", torch.bfloat16), ("gemm", torch.float16)])
def test_invalid_temperature_rows_get_key_0(emu, gen, path, dtype):
    """The CUDA kernels turn a NaN, negative or infinite temperature into key 0
    ("no valid entry") for that row only; the CPU kernel raises instead."""
    h, w, b = exact_problem(gen, 6, 130, 16, dtype)
    temperature = torch.tensor([1.0, float("nan"), -1.0, float("inf"), 0.0, 0.25])
    got = emu.shard(h, w, b, 0, 130, path=path, temperature=temperature, seed=9, offset=2)
    assert got[1:4].tolist() == [0, 0, 0]
    for row in (0, 4, 5):  # the valid rows: the CPU's draw for batch row `row` (Philox subsequence offset + row)
        want = cpu_keys(h[row : row + 1], w, b, 0, 130, temperature=temperature[row : row + 1], seed=9, offset=2 + row)
        assert got[row] == want[0], row


# --- merge with d2t, empty shards ---


def test_merge_keys_with_d2t_and_an_empty_shard(emu, gen):
    h, w, _ = exact_problem(gen, 300, 200, 16, torch.bfloat16)
    shards = [(0, 64), (64, 0), (64, 136)]  # (vocab_start, num_valid); the middle shard is empty
    keys = torch.stack([emu.shard(h, w[s : s + n], None, s, n) for s, n in shards])
    assert (keys[1] == 0).all()
    d2t = torch.randint(0, 50, (200,), generator=gen)
    ids, values = emu.merge_keys(keys, d2t)
    want_ids, want_values = ops.merge_keys(keys, d2t)
    assert torch.equal(ids, want_ids) and torch.equal(values, want_values)
    # no valid entry, or a draft id past d2t: -1 and NaN (the CPU raises instead)
    bad = torch.zeros(2, 3, dtype=torch.int64)
    bad[:, 1] = keys[0, 0]
    ids, values = emu.merge_keys(bad, d2t[:0])
    assert ids.tolist() == [-1, -1, -1] and values.isnan().all()


# --- the grid-y loop, padding rows, ties across blocks, special values ---


@pytest.mark.parametrize("path", ["simt", "mma", "gemm", "mma/0", "mma/4", "mma/10", "mma/11", "mma/16", "mma/19"])
@pytest.mark.parametrize("max_grid_y", [1, 2])
def test_grid_y_loop(emu, gen, path, max_grid_y):
    h, w, b = exact_problem(gen, 130, 150, 24, torch.bfloat16, "f")
    got = emu.shard(h, w, b, 0, 150, path=path, max_grid_y=max_grid_y)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 150), f"{path} grid y <= {max_grid_y}")
    t = torch.full((130,), 0.7)
    got = emu.shard(h, w, b, 0, 150, path=path, max_grid_y=max_grid_y, temperature=t, seed=3, offset=5)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 150, temperature=t, seed=3, offset=5), "sample")


# Each path with each dtype it serves (gemm: one) and every
# tensor-core variant (alternating bf16 / fp16), for the tests of special rows.
EVERY_PATH_AND_VARIANT = [
    ("simt", torch.float32),
    ("simt", torch.bfloat16),
    ("simt", torch.float16),
    ("mma", torch.bfloat16),
    ("mma", torch.float16),
    ("gemm", torch.float16),
    *[(f"mma/{v}", (torch.bfloat16, torch.float16)[v % 2]) for v in range(emulation.NUM_MMA_VARIANTS)],
]


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_VARIANT)
def test_padding_rows_never_win(emu, gen, path, dtype):
    h, w, b = exact_problem(gen, 9, 256, 16, dtype, "f" if dtype != torch.float32 else "t", lo=0, hi=2)
    w[70:] = 8.0  # padding rows past num_valid = 70, far larger than every real row
    b[70:] = 1e4
    got = emu.shard(h, w, b, 0, 70, path=path)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 70), path)
    assert (decode(got) < 70).all()


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_VARIANT)
@pytest.mark.parametrize("scramble", [False, True])
def test_ties_across_blocks_go_to_the_smallest_index(emu, gen, path, dtype, scramble):
    """Random float data; the winning row is copied to rows in other warps, m-tiles
    and blocks: identical rows give identical logits (rule 5), the smallest index wins."""
    batch, rows, hidden_size = 12, 400, 40
    h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
    w = (torch.randn(rows, hidden_size, generator=gen) * 0.1).to(dtype)
    win = torch.randn(hidden_size, generator=gen).to(dtype)
    places = [399, 263, 130, 69, 37, 21]
    for r in places:
        w[r] = win
    h[:] = (win.float() * 3 + torch.randn(batch, hidden_size, generator=gen) * 0.05).to(dtype)
    got = emu.shard(h, w, None, 0, rows, path=path, scramble=scramble, order_seed=int(gen.initial_seed()) % 1000)
    assert (decode(got) == 21).all(), decode(got)
    assert torch.equal(decode(got), decode(cpu_keys(h, w, None, 0, rows)))


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_VARIANT)
def test_nan_negative_zero_and_infinite_rows(emu, gen, path, dtype):
    h, w, _ = exact_problem(gen, 6, 150, 16, dtype)
    h[0] = 0.0  # every logit +-0.0: all tie, index 0 wins
    h[1] = -0.0
    h[2, 3] = float("nan")  # every logit NaN: index 0
    got = emu.shard(h, w, None, 0, 150, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, 150), "+-0 and NaN rows")
    assert decode(got)[:3].tolist() == [0, 0, 0]
    w[100] = 0.0
    w[100, 5] = float("nan")  # a NaN weight row wins every batch row (row 2: all NaN, index 0)
    got = emu.shard(h, w, None, 0, 150, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, 150), "a NaN row")
    assert decode(got).tolist() == [100, 100, 0, 100, 100, 100]
    b = torch.full((150,), float("-inf"), dtype=torch.float32 if dtype != torch.float32 else dtype)
    got = emu.shard(h[3:], w[:100], b[:100], 9, 100, path=path)  # all -inf: the first valid index
    assert decode(got).tolist() == [9, 9, 9]
    assert_keys_equal(got, cpu_keys(h[3:], w[:100], b[:100], 9, 100), "-inf rows")
    b[42] = float("inf")
    got = emu.shard(h[3:], w[:100], b[:100], 0, 100, path=path)
    assert decode(got).tolist() == [42, 42, 42]


@pytest.mark.parametrize(
    "path,dtype",
    [("simt", torch.float32), ("simt", torch.bfloat16), ("mma", torch.bfloat16), ("mma/4", torch.float16)]
    + [(f"mma/{v}", torch.bfloat16) for v in (7, 10, 11)]
    + [(f"mma/{v}", (torch.bfloat16, torch.float16)[v % 2]) for v in TMA_TWINS],
)
def test_random_floats_against_the_float64_reference(emu, gen, path, dtype):
    for batch, rows, hidden_size in ((3, 300, 4104), (20, 129, 40)):
        h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
        w = torch.randn(rows, hidden_size, generator=gen).to(dtype)
        got = emu.shard(h, w, None, 0, rows, path=path)
        ids, values = localargmax.decode_keys(got)
        logits, err = reference_logits(h, w), error_bound(h, w)  # the float32 error bound of every entry
        # clear rows give the float64 id, near-ties lie within the bound (3 rows: at least one clear)
        check_against_reference(ids, h, w, min_clear_fraction=0.6, reference=(logits, err), context=path)
        rows, best = torch.arange(batch), logits.argmax(1)
        assert ((values.double() - logits[rows, ids]).abs() <= err[rows, ids]).all()
        assert ((values.double() - logits[rows, best]).abs() <= 2 * err[rows, ids] + err[rows, best]).all()


@pytest.mark.parametrize("path", ["simt", "mma", "mma/0", "mma/4", "mma/10", "mma/11", "mma/16", "mma/19"])
def test_weight_offsets_beyond_2_31_elements(emu, gen, path):
    """A weight view whose rows lie 2**23 + 8 elements apart: rows >= 256 sit
    past element 2**31 (4 GiB of bf16 address space, mostly never touched)."""
    rows, hidden_size, ldw = 300, 16, 2**23 + 8
    h, w, _ = exact_problem(gen, 9, rows, hidden_size, torch.bfloat16)
    w[290] = 3.0  # the winner sits past 2**31 elements
    h[:] = h.abs() + 1
    view = emu.alloc_weight_view(rows, ldw, hidden_size, torch.bfloat16, w)
    got = emu.shard(h, view, None, 0, rows, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, rows), "2**31 offsets")
    assert (decode(got) == 290).all()


# --- the log-partition (the *_lse ops, CUDA-core kernel + merge_partition_kernel) ---


def _ref_partition(h, w, b, num_valid, scale=1.0, soft_cap=None, temperature=None):
    """float64 logsumexp(x / T) of the valid rows' transformed logits, per row."""
    x = reference_logits(h, w[:num_valid], None if b is None else b[:num_valid]).double()
    if soft_cap is not None:
        x = torch.tanh(x / soft_cap) * soft_cap
    x = x * scale
    if temperature is not None:
        x = x / torch.where(temperature > 0, temperature, 1.0).double()[:, None]
    return x


LSE_CASES = [
    ("simt", dtype, shape)
    for dtype in ALL
    for shape in ((1, 1, 8), (3, 130, 24), (9, 300, 40), (5, 63, 7), (17, 129, 33))
] + [("gemm", dtype, shape) for dtype in HALF for shape in ((1, 1, 8), (7, 300, 40), (130, 4200, 16))]


@pytest.mark.parametrize("path,dtype,shape", LSE_CASES, ids=str)
def test_log_partition_against_float64(emu, gen, path, dtype, shape):
    """The emulated CUDA-core kernel (and the gemm path's keys kernel) with
    the log-partition: keys bit-equal to
    the CPU kernel's (exact data: the transform is the same function); ref is
    the key's value; ref + log(sum) is the float64 logsumexp of the valid
    rows within 1e-5, padding that would dominate excluded; top-k carries
    the same pairs; sampling's pair refers to the sampled entry."""
    batch, rows, hidden_size = shape
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "f" if dtype != torch.float32 else "t")
    num_valid = max(1, rows - 5)
    w[num_valid:] = 3  # padding: the largest logits of the problem if counted
    kw = {"path": path, "gemm_chunk": 50}  # gemm: several chunks of batch rows
    for scale, cap in ((1.0, None), (0.05, 2.0)):
        keys, pairs = emu.shard(h, w, b, 7, num_valid, log_partition=True, scale=scale, soft_cap=cap, **kw)
        want_keys, want_pairs = ops.shard_argmax_lse(h, w, b, 7, num_valid, scale, cap or 0.0)
        assert_keys_equal(keys, want_keys, f"lse keys {scale} {cap}")
        assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1]), "log-partition ref is not the key's value"
        x = _ref_partition(h, w, b, num_valid, scale, cap)
        err = (pairs[:, 0].double() + pairs[:, 1].double().log() - torch.logsumexp(x, 1)).abs().max()
        tol = 1e-5 * max(1.0, float(x.abs().max()) * 2.0**-10)
        assert float(err) <= tol, f"log-partition error {float(err):.3g} > {tol:.3g} (scale {scale}, cap {cap})"
        assert float((pairs - want_pairs).abs().max()) <= 1e-4 * float(pairs[:, 1].max())  # vs the CPU's order
        if path == "simt":  # top-k runs on simt only
            top, top_pairs = emu.shard(h, w, b, 7, num_valid, k=3, log_partition=True, scale=scale, soft_cap=cap)
            assert torch.equal(top[:, 0], keys) and torch.equal(top_pairs, pairs)
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 7.0] * 22)[:batch]
    keys, pairs = emu.shard(h, w, b, 7, num_valid, temperature=t, seed=5, offset=3, log_partition=True, **kw)
    assert_keys_equal(keys, ops.shard_sample(h, w, b, 7, num_valid, t, 5, 3), "sample keys")
    ids = localargmax.decode_keys(keys)[0] - 7
    x = _ref_partition(h, w, b, num_valid, temperature=t)
    want = x.gather(1, ids[:, None])[:, 0] - torch.logsumexp(x, 1)
    assert float((-pairs[:, 1].double().log() - want).abs().max()) <= 1e-5
    greedy = emu.shard(h, w, b, 7, num_valid, log_partition=True, **kw)[1]
    assert torch.equal(pairs[t == 0], greedy[t == 0])


def test_simt_log_partition_specials_and_empty_shard(emu, gen):
    """-inf rows (ref -inf, sum 0), a NaN entry (sum NaN), a +inf entry
    (ref +inf, sum = the number of +inf entries), across blocks; an empty
    shard and a batch of 0 return (-inf, 0) without a launch; the mma path
    refuses the log-partition."""
    h, w, _ = exact_problem(gen, 4, 200, 8, torch.float32)
    b = torch.zeros(200)
    h[0] = 1.0
    w[:, 0] = 1.0
    b[:] = -math.inf  # every row -inf ...
    b[150] = math.nan  # ... but a NaN at 150 and +inf at 70 and 190
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs[:, 1].isnan().all() and torch.equal(keys, ops.shard_argmax(h, w, b, 0, 200))
    b[150] = -math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[-math.inf, 0.0]] * 4
    b[70] = b[190] = math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[math.inf, 2.0]] * 4 and (decode(keys) == 70).all()
    keys, pairs = emu.shard(h, w, b, 0, 0, log_partition=True)
    assert (keys == 0).all() and pairs.tolist() == [[-math.inf, 0.0]] * 4
    assert emu.shard(h[:0], w, b, 0, 200, log_partition=True)[1].shape == (0, 2)
    with pytest.raises(ValueError, match="cannot compute the log-partition"):
        emu.shard(h, w, b, log_partition=True, path="mma")


def test_the_models_mma_choice_is_choose_mma_variant(emu):
    """localargmax.bench.predict.cpp_mma_variant (the bandwidth model's C++ auto, the dispatch
    table's incumbent) = choose_mma_variant of shard_argmax_launch.cuh, around every boundary."""
    from localargmax.bench import predict as pm

    for sm_count in (1, 78, 132):
        for num_valid in (1, 64 * 4 * sm_count - 64, 64 * 4 * sm_count - 63, 64 * 4 * sm_count, 18992, 151936):
            for batch in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 1024):
                want = emu.mma_variant(4096, num_valid, batch, sm_count)
                assert pm.cpp_mma_variant(num_valid, batch, sm_count) == want, (sm_count, num_valid, batch)
