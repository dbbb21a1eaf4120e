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
from localargmax._validation import MMA_CONFIGS
from localargmax.reference import reference_logits
from tests.support import emulation
from tests.support.emulation import CSRC
from tests.support.emulation_cases import (
    ALL,
    EVERY_PATH_AND_CONFIG,
    HALF,
    TOPK_PATHS,
    assert_keys_equal,
    cpu_keys,
    decode,
    exact_problem,
    ops,
    shapes,
)
from tests.support.reference import check_against_reference, error_bound

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")


# --- every instantiation, and the same kernel text in both builds ---


# The tensor-core kernel's configs (csrc/cuda/mma_configs.h, read from _C), each forced by name.
MMA_CONFIG_PATHS = [f"mma/{name}" for name in MMA_CONFIGS]
# Configs that sum in the same order (equal KC): bit-identical keys, neighbours of each class
# in table order (every TMA config lands next to the others of its class, so beside its twin's).
_CLASSES = [[n for n, m in MMA_CONFIGS.items() if m.kc == kc] for kc in sorted({m.kc for m in MMA_CONFIGS.values()})]
SAME_ORDER = [(a, b) for names in _CLASSES for a, b in zip(names, names[1:])]


def _template(m) -> str:
    return f"{m.nt}, {m.mt}, {m.wm}, {m.wn}, {m.sk}, {m.kc}, {m.st}, {m.minb}, {str(m.tma).lower()}"


def test_the_emulation_compiles_the_table_c_exports(emu):
    """The emulation library and _C are built from the one table: the same names in the same order."""
    assert emu.mma_configs == list(MMA_CONFIGS)
    assert len(MMA_CONFIGS) == 14 and len(SAME_ORDER) == 12


def _instantiations():
    names = []
    for t, vec in (("float", 4), ("__nv_bfloat16", 8), ("__half", 8)):
        for nb in (1, 2, 4, 8):
            for v in (vec, 1):
                for topk in ("false", "true"):
                    names.append(f"shard_argmax_kernel<{t}, {nb}, {v}, {topk}>")
                    names.append(f"shard_argmax_kernel<{t}, {nb}, {v}, {topk}, true>")  # LSE: the *_lse ops
        if t != "float":
            names += [f"shard_argmax_mma_pipe_kernel<{t}, {_template(m)}>" for m in MMA_CONFIGS.values()]
            names.append(f"logits_to_keys_kernel<{t}>")
            names.append(f"logits_to_keys_kernel<{t}, true>")
    return names + [
        "merge_keys_kernel",
        "merge_partition_kernel",
        "frame_init_kernel",
        "merge_frames_kernel",
        "log_probs_from_pairs_kernel",
    ]


def test_every_instantiation_the_launchers_pick_runs(emu, gen):
    """Batch sizes at every NB / NT boundary, vector and scalar loads, top-k
    and argmax, each dtype: the launch choices of shard_launch.cuh reach
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
    # mma: auto's choices at every NT boundary, split (few blocks per SM) or not, under the
    # H200's opt-in limit, 56 KiB (no n4_r128 / n8_*) and 48 KiB; then every config forced.
    auto = set()
    for dtype in HALF:
        for batch in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129):
            h, w, _ = exact_problem(gen, batch, 300, 8, dtype)
            want = cpu_keys(h, w, None, 0, 300)
            # 5 tiles of 64 rows: >= 4 per SM on 1 SM; on 132 a small grid (split K, 64-row tiles at NT = 8)
            for sm_count in (1, 132):
                for limit in (emulation.DEFAULT_SMEM_LIMIT, 56 * 1024, 48 * 1024):
                    auto.add(emu.mma_config(8, 300, batch, sm_count, limit))
                    got = emu.shard(h, w, path="mma", sm_count=sm_count, smem_limit=limit)
                    assert_keys_equal(got, want, f"mma {dtype} B={batch}")
        for path in MMA_CONFIG_PATHS:
            h, w, _ = exact_problem(gen, 3, 3, 8, dtype)
            assert_keys_equal(emu.shard(h, w, path=path), cpu_keys(h, w, None, 0, 3), f"{path} {dtype}")
            if not MMA_CONFIGS[path[4:]].tma:
                got = emu.shard(h, w, path=path, log_partition=True)[0]
                assert_keys_equal(got, cpu_keys(h, w, None, 0, 3), f"{path} {dtype} with log-partition")
    # auto: every cp.async config of one warp column, never a TMA one (sm_90+ only; a GPU --tune decides)
    # nor one of several warps along the batch (n16_r64_w2: forced only until a GPU measures it)
    assert auto == {n for n, m in MMA_CONFIGS.items() if not m.tma and m.wn == 1}, auto
    keys = torch.stack([ops.shard_argmax(*exact_problem(gen, 4, 5, 8, torch.float32)[:2], None, 0, 5, "generic")])
    emu.merge_keys(keys)
    emu.frame_init(8, 4, False, 5, 4)
    emu.merge_frames(keys, 1, 1, False, 0, None, 0, None, False, False)
    emu.log_probs_from_pairs(torch.zeros(1), torch.zeros(1, 1, 2), None)
    assert set(_instantiations()) == set(emu.launched), set(_instantiations()) ^ set(emu.launched)


# --- the planned step's kernels (step_kernels.cuh) against the CPU op of the same row code ---

HEADER = 3  # kFrameHeader: size, -size, vocab_end


def test_frame_init_writes_the_header_and_zeroes_the_keys(emu):
    """frame_init_kernel's header equals the CPU step_frame's, over grids of 1 to 3 blocks."""
    for n, pairs in ((0, False), (1, True), (256, False), (700, True)):
        words = HEADER + n + (n if pairs else 0)
        frame = emu.frame_init(words, n, pairs, 1234, n)
        size = n + 1 + (2**40 if pairs else 0)  # kPairsFlag
        assert frame[:HEADER].tolist() == [size, -size, 1234]
        assert torch.all(frame[HEADER : HEADER + n] == 0)
        assert torch.all(frame[HEADER + n :] == int.from_bytes(b"\xa5" * 8, "little", signed=True))  # untouched


def _rank_frames(gen, tp, batch, vocab, mode, k, pairs, flip, dtype=torch.float32):
    """Every rank's step_frame on the CPU (the generic path) for an exact problem
    over ``vocab`` rows split unevenly (the last shard may be empty): ``[tp, words]``,
    or the all-reduce MAX of the sign-flipped frames ``[1, words]``; and the temperature."""
    h, w, b = exact_problem(gen, batch, vocab, 8, dtype, bias="f")
    if batch:
        h[0] = float("nan")  # a NaN row
        b[vocab // 3] = float("-inf")
    temperature = torch.rand(batch, generator=gen) + 0.25 if mode == 2 or (mode == 0 and pairs) else None
    per = -(-vocab // tp) if tp > 1 else vocab
    frames = []
    for r in range(tp):
        start, end = min(r * per, vocab), min((r + 1) * per, vocab)
        frame = torch.ops.localargmax.step_frame.default(
            h, w[start:end], b[start:end], start, end - start, mode, k, temperature, 5, 9, 1.0, 0.0, pairs, pairs,
            flip, "generic", None, None,
        )  # fmt: skip
        frames.append(frame)
    frames = torch.stack(frames)
    return (frames.max(0, keepdim=True).values if flip else frames), temperature


def _merge_both(emu, frames, batch, k, pairs, mode, d2t=None, target_vocab=0, temperature=None, flip=False):
    """(CPU op, emulated kernel) outputs; the CPU op with raise_errors=False (the device contract: a flag)."""
    log_probs, log_odds = pairs, pairs and mode == 0
    cpu = torch.ops.localargmax.merge_frames.default(
        frames, batch, k, pairs, mode, d2t, target_vocab, temperature, log_probs, log_odds, flip, False
    )
    got = emu.merge_frames(frames, batch, k, pairs, mode, d2t, target_vocab, temperature, log_probs, log_odds, flip)
    return cpu, got


def _assert_same_merge(cpu, got, context):
    ids, values, log_probs, log_odds, ok = cpu
    assert got[4] == bool(ok), f"{context}: flag {got[4]} != {bool(ok)}"
    assert torch.equal(got[0], ids), f"{context}: ids {got[0]} != {ids}"
    for name, g, c in (("values", got[1], values), ("log_probs", got[2], log_probs), ("log_odds", got[3], log_odds)):
        assert torch.equal(g.view(torch.int32), c.view(torch.int32)), f"{context}: {name} {g} != {c}"


@pytest.mark.parametrize("tp", [1, 3, 8])
def test_merge_frames_kernel_equals_the_cpu_merge(emu, gen, tp):
    """merge_frames_kernel (one block of 256 threads, the step's flag by
    __syncthreads_and) against the CPU merge_frames over the same frames:
    argmax, top-k and sample, with and without the log-partition pairs, the
    all-reduce's flipped frames, d2t with the target vocabulary, batch 0 and
    batches past one pass of the block; then the planted faults (a rank's size,
    a key past the vocabulary, d2t's length, a mapped id past the target
    vocabulary, a row no rank has an entry for), each clearing the flag on
    both, with the same outputs."""
    vocab = 5 * tp + 2
    for batch in (0, 1, 7, 300):
        for mode, k in ((0, 1), (1, 3), (2, 1)):
            for pairs in (False, True):
                for flip in (False, True) if not pairs and mode != 1 else (False,):
                    frames, t = _rank_frames(gen, tp, batch, vocab, mode, k, pairs, flip)
                    context = f"tp {tp} batch {batch} mode {mode} pairs {pairs} flip {flip}"
                    cpu, got = _merge_both(emu, frames, batch, k, pairs, mode, temperature=t, flip=flip)
                    assert batch == 0 or bool(cpu[4]), context
                    _assert_same_merge(cpu, got, context)
                    d2t = torch.randint(0, 50, (vocab,), generator=gen)
                    cpu, got = _merge_both(emu, frames, batch, k, pairs, mode, d2t, vocab + 50, t, flip)
                    _assert_same_merge(cpu, got, context + " d2t")
    frames, t = _rank_frames(gen, tp, 300, vocab, 0, 1, True, False)
    d2t = torch.zeros(vocab, dtype=torch.int64)
    faults = {
        "size": lambda f: f[-1, :2].add_(1),
        # the low word holds 0xFFFFFFFF - id (csrc/common/packed_key.h)
        "key past the vocabulary": lambda f: f[-1, HEADER + 299].copy_(
            (f[-1, HEADER + 299] & -(1 << 32)) | (0xFFFFFFFF - vocab - 3)
        ),
        "a row with no entry on any rank": lambda f: f[:, HEADER + 10].fill_(0),
    }
    for name, plant in faults.items():
        bad = frames.clone()
        plant(bad)
        cpu, got = _merge_both(emu, bad, 300, 1, True, 0, temperature=t)
        assert not bool(cpu[4]), name
        _assert_same_merge(cpu, got, name)
    for name, table, target in (("d2t length", d2t[:-1], 0), ("mapped past the target", d2t + vocab, vocab)):
        cpu, got = _merge_both(emu, frames, 300, 1, True, 0, table, target, t)
        assert not bool(cpu[4]), name
        _assert_same_merge(cpu, got, name)


def test_tma_configs_are_forced_only_twins():
    """The _tma configs copy the weight by TMA, each the twin of a cp.async config with the same
    fields (so the same sums); their dynamic shared memory is the twin's plus ST 8-byte mbarriers;
    auto never picks them (test above) nor does a dispatch table (predict.mma_candidates)."""
    from bench import predict as pm

    tma = [m for m in MMA_CONFIGS.values() if m.tma]
    assert len(tma) == 5
    for m in tma:
        twin = MMA_CONFIGS[pm.twin_of(m)]
        assert twin.name + "_tma" == m.name and not twin.tma and m.order == twin.order
        assert m.dynamic_smem == twin.dynamic_smem + 8 * m.st and m.static_smem == twin.static_smem
        assert all(m.name not in pm.mma_candidates(b) for b in (1, 16, 32, 33, 64, 128))
        assert m.name in pm.mma_tma_twins(8 if m.kc == 2 else 64)
    assert all(pm.twin_of(m) is None for m in MMA_CONFIGS.values() if not m.tma)


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
    # mma_sync.cuh: the asm under nvcc, the emulation on the host: one mma.sync per dtype, one switch;
    # the cp.async and griddepcontrol wrappers defined once per compiler, each with a host twin.
    body = (CSRC / "cuda" / "mma_sync.cuh").read_text()
    assert body.count("emu::mma_m16n8k16(") == 1 and 'LAM_MMA("bf16")' in body and 'LAM_MMA("f16")' in body
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
        re.search(r"(_kernel|mma_pipe)<.*>\(.*\)::(block_best|candidates|lists|warp_best|stages|warp_partition)$", ln)
        for ln in inside
    ), inside


# --- argmax on every path, exact problems: keys bit-equal to the CPU kernel's ---

SIMT = shapes("1x1x8 2x65x16 3x130x24 4x300x40 5x63x7 8x129x4104 9x64x33 17x127x1 130x70x16")
MMA = shapes("1x1x8 8x129x16 9x65x24 16x300x40 17x127x8 32x64x4104 33x129x40 64x65x16 65x130x24 128x70x8 130x3x16")
GEMM = shapes("1x1x8 7x300x40 130x129x4104")


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
VARIANT_SHAPES = shapes("1x1x8 7x65x40 16x129x104 23x300x264 40x64x8 64x200x4104 100x127x72 128x130x24 129x3x16")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("path", MMA_CONFIG_PATHS)
def test_every_mma_config_against_the_cpu_kernel(emu, gen, dtype, path):
    for i, (batch, rows, hidden_size) in enumerate(VARIANT_SHAPES):
        h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, (None, "f", "t")[i % 3])
        got = emu.shard(h, w, b, 77, rows, path=path)
        assert_keys_equal(got, cpu_keys(h, w, b, 77, rows), f"{path} B={batch} rows={rows} H={hidden_size}")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("pair", SAME_ORDER, ids=str)
def test_identical_rows_give_identical_bits_in_every_place_and_config(emu, gen, dtype, pair):
    """Rule 5 on random floats (inexact sums): a weight row copied to rows in
    other warps, m-tiles and tiles, and a hidden row copied to other batch
    positions, give bit-identical keys (value bits) wherever they sit; the
    configs of one summation order (split-K or not, a choice by grid size)
    and shards cut at another row (another num_valid / vocab_start) agree bit for bit."""
    batch = min(max(MMA_CONFIGS[c].batch_rows for c in pair), 64)
    rows, hidden_size = 300, 264
    h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
    w = (torch.randn(rows, hidden_size, generator=gen)).to(dtype)
    for r in (17, 40, 63, 64, 150, 299):
        w[r] = w[5]
    for b in range(1, batch, 3):
        h[b] = h[0]
    keys = {c: emu.shard(h, w, None, 0, rows, path=f"mma/{c}") for c in pair}
    assert torch.equal(keys[pair[0]], keys[pair[1]])
    for c in pair:  # same values for the duplicated hidden rows; ties to the smallest index
        got = keys[c]
        assert (got[1::3] == got[0]).all()
        # against float64 with the float32 error bound; the copies of row 5 tie it exactly, so only
        # row 5 may win for them (rule 1): their columns are taken out of the reference
        logits = reference_logits(h, w)
        logits[:, [17, 40, 63, 64, 150, 299]] = -math.inf
        reference = (logits, error_bound(h, w))
        check_against_reference(decode(got), h, w, min_clear_fraction=0.5, reference=reference, context=f"mma/{c}")
        # the value of row 5 and of its copies, as winners: plant them as the winners via a bias
        bias = torch.full((rows,), -1e4)
        bias[[5, 17, 40, 63, 64, 150, 299]] = 0.0
        won = emu.shard(h, w, bias, 0, rows, path=f"mma/{c}")
        assert (decode(won) == 5).all()
        later = emu.shard(h, w[6:], bias[6:], 6, rows - 6, path=f"mma/{c}")  # row 5 cut away: copy 17 wins
        assert (decode(later) == 17).all() and torch.equal(later >> 32, won >> 32)


# Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin): H100 / H200, A100, sm_86 / sm_89,
# and the 48 KiB without opt-in.
SMEM_LIMITS = (227 * 1024, 163 * 1024, 99 * 1024, 48 * 1024)


@pytest.mark.parametrize("smem_limit", SMEM_LIMITS)
def test_auto_never_picks_a_config_past_the_shared_memory_limit(emu, gen, smem_limit):
    """choose_mma_config under the device's opt-in limit: the config it picks fits, sums in the
    order class of the batch (KC = 2 up to 32, KC = 1 past it) whatever the limit, gives the
    bits of the unlimited choice, and is the model's cpp_mma_config."""
    from bench import predict as pm

    for batch in (1, 9, 17, 32, 33, 64, 65):
        for num_valid in (300, 151936):
            for sm_count in (1, 132):
                name = emu.mma_config(4096, num_valid, batch, sm_count, smem_limit)
                assert 0 < MMA_CONFIGS[name].smem <= smem_limit, (name, smem_limit)
                unlimited = emu.mma_config(4096, num_valid, batch, sm_count)
                assert MMA_CONFIGS[name].order == MMA_CONFIGS[unlimited].order == f"KC={2 if batch <= 32 else 1}"
                assert pm.cpp_mma_config(num_valid, batch, sm_count, smem_limit) == name
    h = torch.randn(40, 264, generator=gen).to(torch.bfloat16)
    w = torch.randn(300, 264, generator=gen).to(torch.bfloat16)
    assert torch.equal(emu.shard(h, w, path="mma", smem_limit=smem_limit), emu.shard(h, w, path="mma"))


def test_forced_config_past_the_shared_memory_limit_raises(emu, gen):
    """A forced config whose shared memory exceeds the device's opt-in limit: ValueError naming the
    config, its bytes and the limit (run_mma's TORCH_CHECK_VALUE); a name not in the table is refused."""
    h, w, _ = exact_problem(gen, 3, 3, 8, torch.bfloat16)
    big = max(MMA_CONFIGS.values(), key=lambda m: m.smem)
    assert big.smem > 48 * 1024
    with pytest.raises(ValueError, match=rf"config '{big.name}' needs {big.smem} bytes .* allows {48 * 1024}"):
        emu.shard(h, w, path=f"mma/{big.name}", smem_limit=48 * 1024)
    assert_keys_equal(emu.shard(h, w, path=f"mma/{big.name}", smem_limit=big.smem), cpu_keys(h, w, None, 0, 3), "fits")
    with pytest.raises(ValueError, match="no such mma config"):
        emu.shard(h, w, path="mma/no_such_config")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("batch,rows,hidden_size", GEMM)
def test_gemm_keys(emu, gen, dtype, batch, rows, hidden_size):
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, (None, "f", "t")[batch % 3])
    got = emu.shard(h, w, b, 5, rows, path="gemm", gemm_chunk=50)  # chunks of 50 batch rows: b0 > 0
    assert_keys_equal(got, cpu_keys(h, w, b, 5, rows), "gemm")


# --- top-k and sampling ---


@pytest.mark.parametrize("path,dtype", TOPK_PATHS)
@pytest.mark.parametrize(
    "batch,rows,hidden_size,k", [(1, 300, 40, 64), (3, 129, 4104, 5), (9, 65, 24, 1), (17, 200, 16, 64)]
)
def test_topk_in_torch_topk_order(emu, gen, path, dtype, batch, rows, hidden_size, k):
    """Every path that takes top-k (simt, mma auto, every config with room for it) against the CPU kernel's
    keys and float64's torch.topk: k past a block's rows (64 of 65), k past the shard (64 of 200 at B 17
    over n-tiles of both kinds), one row kept."""
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "t")
    got = emu.shard(h, w, b, 3, rows, k=k, path=path)
    assert_keys_equal(got, cpu_keys(h, w, b, 3, rows, k=k), "topk")
    logits = reference_logits(h, w, b)
    kept = min(k, rows)
    want = torch.topk(logits, kept, dim=1)
    _, values = localargmax.decode_keys(got[:, :kept])
    assert torch.equal(values.double(), want.values)
    ids = decode(got[:, :kept]) - 3
    assert torch.equal(logits.gather(1, ids), want.values)
    assert (got[:, kept:] == 0).all()  # empty slots


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_CONFIG)
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


@pytest.mark.parametrize("tp", [1, 3, 8])
def test_log_probs_from_pairs_kernel_equals_the_cpu_op(emu, gen, tp):
    """log_probs_from_pairs_kernel (one thread per row) against the CPU op:
    the same bits at batch 0, 1, 255, 257 (a partial second block), [B] and
    [B, k] values, with and without temperatures, planted -inf / +inf / NaN
    refs and tied refs."""
    for batch in (0, 1, 255, 257):
        pairs = torch.stack([torch.randn(tp, batch, generator=gen) * 20, torch.rand(tp, batch, generator=gen) * 50], -1)
        if batch > 4:
            pairs[0, 0, 0], pairs[-1, 1, 0], pairs[0, 2, 0] = -math.inf, math.nan, math.inf
            pairs[:, 3, 0] = pairs[0, 3, 0]
        t = torch.rand(batch, generator=gen) * 2
        t[::3] = 0.0
        values = pairs[..., 0].max(dim=0).values - torch.rand(batch, generator=gen)
        for v in (values, torch.stack([values, values - 3.0], dim=1)):
            for temperature in (None, t):
                want = ops.log_probs_from_pairs(v, pairs, temperature)
                got = emu.log_probs_from_pairs(v, pairs, temperature)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (tp, batch, got, want)
