"""The bandwidth model (localargmax.bench.predict) and ``--predict``: hand-computed
cases, monotonicity, the review's table, the register reader, the CLI and the
committed PREDICTED results."""

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localargmax.bench import predict as pm
from localargmax.bench import predict_cli
from localargmax.bench.data import PRESETS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "predicted_h200.json"

# A toy device where only the term under test binds: no fixed costs, no epilogue,
# huge L2 and tensor-core rates, 1 us latency.
TOY = dataclasses.replace(
    pm.H200,
    sms=4,
    stream_Bps=1e15,
    l2_Bps=1e18,
    latency_s=1e-6,
    mma_sync_flops=1e18,
    launch_s=0.0,
    zero_fill_s=0.0,
    cta_epilogue_s=0.0,
)
MMA_NT1 = pm.mma_variant(0)  # the register kernel NT = 1, KV = 2: 150 registers, 3 CTAs of 128 threads per SM


def test_ctas_per_sm_by_hand():
    # 150 regs -> 152 per thread -> 4864 per warp (a multiple of 256): 65536 // 4864 = 13 warps -> 3 CTAs of 4 warps
    assert pm.ctas_per_sm(pm.H200, 128, 150, 0) == 3
    assert pm.ctas_per_sm(pm.H200, 128, 212, 0) == 2  # 6912 per warp -> 9 warps -> 2 CTAs
    assert pm.ctas_per_sm(pm.H200, 128, 110, 0) == 4  # 3584 -> 18 warps -> 4
    assert pm.ctas_per_sm(pm.H200, 256, 54, 0) == 4  # 1792 -> 36 warps -> 4 CTAs of 8 warps
    assert pm.ctas_per_sm(pm.H200, 128, 32, 100 * 1024) == 2  # shared memory: 228 KiB // (100 + 1) KiB
    assert pm.ctas_per_sm(pm.H200, 64, 16, 0) == 32  # the CTA limit


def test_littles_law_latency_bound_by_hand():
    # 30 tiles of 128 rows, H = 4096 bf16: 1 MiB per CTA, 4 warps x 2 x 2 KiB = 16 KiB in flight
    # -> 64 steps + 1 fill = 65 latencies per CTA; 12 slots -> rounds of 12, 12, 6 -> 3 x 65 us.
    p = pm.predict(TOY, MMA_NT1, 128 * 30, 4096, 1)
    assert (p.ctas, p.ctas_per_sm, p.rounds) == (30, 3, 3)
    assert p.bound == "latency"
    assert p.time_s == pytest.approx(3 * 65e-6)
    assert p.in_flight_per_sm == pytest.approx(3 * 16 * 1024)
    assert p.fraction_of_copy == pytest.approx(128 * 30 * 4096 * 2 / (3 * 65e-6) / TOY.copy_Bps)


def test_littles_law_bandwidth_bound_by_hand():
    # at 1e11 B/s a full round (12 MiB) takes 125.8 us > 65 us; the last round (6 MiB, 62.9 us) is latency-bound
    spec = dataclasses.replace(TOY, stream_Bps=1e11)
    p = pm.predict(spec, MMA_NT1, 128 * 30, 4096, 1)
    assert p.bound == "bandwidth"
    assert p.time_s == pytest.approx(2 * 12 * 2**20 / 1e11 + 65e-6)


def test_wave_quantisation_costs_a_whole_cta_time():
    # 12 slots: 12 CTAs take one latency-bound round, 13 take two
    one = pm.predict(TOY, MMA_NT1, 128 * 12, 4096, 1)
    two = pm.predict(TOY, MMA_NT1, 128 * 13, 4096, 1)
    assert (one.rounds, two.rounds) == (1, 2)
    assert two.time_s == pytest.approx(2 * one.time_s)


def test_fixed_costs_and_batch_passes_add_up():
    spec = dataclasses.replace(TOY, launch_s=2e-6, zero_fill_s=3e-6)
    base = pm.predict(TOY, MMA_NT1, 128 * 12, 4096, 8)
    assert pm.predict(spec, MMA_NT1, 128 * 12, 4096, 8).time_s == pytest.approx(base.time_s + 5e-6)
    # batch 9 with NT = 1 (8 rows per pass): two passes over the weight, 24 CTAs, two rounds
    assert pm.predict(TOY, MMA_NT1, 128 * 12, 4096, 9).time_s == pytest.approx(2 * base.time_s)
    # PDL hides 3/4 of the launch; a fused init drops the zero-fill
    fast = pm.variant("mma", built=False, stages=3, tile_rows=128, split_k=1, tile_n=8, pdl=1, fused_init=1)
    slow = dataclasses.replace(fast, params=tuple((k, 0 if k in ("pdl", "fused_init") else v) for k, v in fast.params))
    gap = pm.predict(spec, slow, 4096, 4096, 1).time_s - pm.predict(spec, fast, 4096, 4096, 1).time_s
    assert gap == pytest.approx(0.75 * 2e-6 + 3e-6)


def test_issue_bound_simt_by_hand():
    # simt NB = 8: per 512 B warp-step 8 + 8 x 17 = 144 warp-instructions (FMA); 4 per clock per SM
    spec = dataclasses.replace(TOY, sms=132, clock_hz=2e9, latency_s=0.1e-6)
    rows, hidden = 64 * 132, 4096
    p = pm.predict(spec, pm.variant("simt", nb=8), rows, hidden, 8)
    assert p.bound == "issue"
    assert p.time_s == pytest.approx((hidden * 2 * 64 / 512) * 144 / (4 * 2e9))


def test_gemm_path_by_hand():
    spec = dataclasses.replace(pm.H200, launch_s=0.0, zero_fill_s=0.0)
    rows, hidden, b = 16000, 4096, 4  # padded to 16000 (a multiple of 64)
    mem = rows * hidden * 2 / (spec.gemm_mem_efficiency * spec.stream_Bps)
    logits = 8 * b * rows / spec.stream_Bps
    p = pm.predict(spec, pm.variant("gemm"), rows, hidden, b)
    assert p.time_s == pytest.approx(mem + logits + spec.gemm_second_launch_s)
    assert p.bound == "gemm-memory"
    # 1 GiB of float32 logits per GEMM: a chunk of 16777 rows at 16000 columns; 20000 rows -> 2 GEMMs
    assert pm.predict(spec, pm.variant("gemm"), rows, hidden, 16777).rounds == 1
    assert pm.predict(spec, pm.variant("gemm"), rows, hidden, 20000).rounds == 2


@pytest.mark.parametrize("path", ["simt", "mma", "gemm"])
def test_monotonic_in_the_right_directions(path):
    shapes = [(18992, 4096), (151936, 4096), (16160, 7168)]
    for rows, hidden in shapes:
        for b in (1, 4, 16, 64, 256):
            v = pm.todays_variant(path, b)
            t = pm.predict(pm.H200, v, rows, hidden, b).time_s
            # more latency, fewer bandwidth, more rows or hidden: never faster
            assert pm.predict(pm.with_latency(pm.H200, 0.9e-6), v, rows, hidden, b).time_s >= t
            slower = dataclasses.replace(pm.H200, stream_Bps=3e12, copy_Bps=pm.H200.copy_Bps)
            assert pm.predict(slower, v, rows, hidden, b).time_s >= t
            assert pm.predict(pm.H200, v, rows + 4096, hidden, b).time_s >= t
            assert pm.predict(pm.H200, v, rows, hidden + 1024, b).time_s >= t
            # fraction of copy never above the read-stream cap
            assert pm.predict(pm.H200, v, rows, hidden, b).fraction_of_copy <= pm.H200.stream_Bps / pm.H200.copy_Bps


def test_more_registers_or_less_in_flight_never_faster():
    rows, hidden = 18992, 4096
    low = pm.Registers({"mma/0": 96, "mma/2": 96}, "test")
    high = pm.Registers({"mma/0": 200}, "test")
    t_low = pm.predict(pm.H200, MMA_NT1, rows, hidden, 1, registers=low)
    t_high = pm.predict(pm.H200, MMA_NT1, rows, hidden, 1, registers=high)
    assert t_low.ctas_per_sm > t_high.ctas_per_sm and t_low.time_s <= t_high.time_s
    kv1 = pm.predict(pm.H200, pm.mma_variant(2), rows, hidden, 1, registers=low)  # KV = 1
    assert kv1.ctas_per_sm == t_low.ctas_per_sm
    assert kv1.time_s > t_low.time_s  # half the bytes in flight, same occupancy: latency-bound, slower
    stages = [pm.variant("mma", built=False, stages=s, tile_rows=128, split_k=1, tile_n=8) for s in (2, 3, 4)]
    times = [pm.predict(pm.H200, v, 16032, 4096, 1).time_s for v in stages]
    assert times == sorted(times, reverse=True)


def test_pipelined_variant_geometry_by_hand():
    # mma/4: 64-row tiles, NT = 1, 2 warps, KC = 2, ST = 4 -> 3 x 2 x 64 x 64 B = 24 KiB in flight per CTA;
    # 109 registers -> 112 x 32 = 3584 per warp -> 18 warps -> 9 CTAs of 2, shared memory
    # 228 KiB // (36992 + 1024) B -> 6 per SM. On TOY (4 SMs): 24 slots; 48 tiles of 64 rows -> 2 rounds,
    # each CTA latency-bound: 64 x 4096 x 2 B / 24 KiB = 21.3 -> 22 + 1 fill = 23 latencies.
    m = pm.MMA_VARIANTS[4]
    assert (m.rows, m.threads, m.smem, m.order) == (64, 64, 36992, "KC=2")
    p = pm.predict(TOY, pm.mma_variant(4), 64 * 48, 4096, 1)
    assert (p.ctas, p.ctas_per_sm, p.rounds, p.bound) == (48, 6, 2, "latency")
    assert p.time_s == pytest.approx(2 * 23e-6)
    assert p.in_flight_per_sm == pytest.approx(6 * 24 * 1024)
    # split-K (mma/7) splits the chunks between warp groups inside the tile: same CTAs, same bytes in flight
    q = pm.predict(TOY, pm.mma_variant(7), 64 * 48, 4096, 1)
    assert q.ctas == 48 and q.in_flight_per_sm == pytest.approx(q.ctas_per_sm * 24 * 1024)
    # batch 9 on NT = 1: two passes; on NT = 2 (mma/5) one
    assert pm.predict(TOY, pm.mma_variant(4), 64 * 48, 4096, 9).ctas == 96
    assert pm.predict(TOY, pm.mma_variant(5), 64 * 48, 4096, 9).ctas == 48
    # PDL: a quarter of the launch; the zero fill stays (DESIGN.md)
    spec = dataclasses.replace(TOY, launch_s=2e-6, zero_fill_s=3e-6)
    gap = pm.predict(spec, pm.mma_variant(4), 64 * 48, 4096, 1).time_s - p.time_s
    assert gap == pytest.approx(0.5e-6 + 3e-6)


def test_tma_variant_geometry_by_hand():
    # mma/16 = mma/4 with the weight tiles by TMA: the same CTAs and bytes in flight, shared memory + 4
    # mbarriers (8 B each). Per step (KC = 2, 64 rows, NT = 1, 2 warps), mma/4: (64 + 8) x 64 x 2 / 16 / 32
    # = 18 warp-wide cp.async x 4 + 2 x 12 = 96 instructions; mma/16: only the hidden rows, 8 x 64 x 2 / 16
    # / 32 = 2 x 4 + 2 x 12, + 2 boxes x 6 + 2 warps x 4 (mbarrier wait) = 52. H = 4096: 64 steps.
    m, t = pm.MMA_VARIANTS[4], pm.MMA_VARIANTS[16]
    assert (t.kind, t.twin, t.rows, t.threads, t.order) == ("tma", 4, m.rows, m.threads, m.order)
    assert t.smem == m.smem + 4 * 8 and t.dynamic_smem == m.dynamic_smem + 4 * 8
    a = pm.geometry(TOY, pm.mma_variant(4), 64 * 48, 4096, 1, 2)
    b = pm.geometry(TOY, pm.mma_variant(16), 64 * 48, 4096, 1, 2)
    assert (a.ctas, a.cta_bytes, a.cta_in_flight) == (b.ctas, b.cta_bytes, b.cta_in_flight)
    assert a.cta_instructions - b.cta_instructions == pytest.approx(64 * (96 - 52))


def test_hidden_rereads_bind_at_l2():
    # each CTA streams its 8 NT hidden rows from L2: at batch 32 on 64-row tiles (mma/6) that is half the
    # weight bytes again; with a slow L2 the round is L2-bound at (weight + hidden) / L2 bandwidth
    spec = dataclasses.replace(TOY, l2_Bps=1e11, stream_Bps=1e12)
    p = pm.predict(spec, pm.mma_variant(6), 64 * 24, 4096, 32)
    assert p.bound == "l2"
    assert p.time_s == pytest.approx(24 * (64 + 32) * 4096 * 2 / 1e11)


# The review's predicted table (shared/reviews/cuda_h200_review.md §2.4): fraction of copy for
# today's default path, L = 0.8 us (low end) to 0.6 us (high end).
REVIEW_TABLE = {
    ("qwen3", 1, 1): (0.88, 0.95),
    ("qwen3", 4, 1): (0.88, 0.92),
    ("qwen3", 8, 1): (0.63, 0.82),
    ("llama3", 8, 1): (0.54, 0.69),
    ("deepseek-v3", 8, 1): (0.56, 0.74),
    ("qwen3", 1, 64): (0.55, 0.73),
    ("qwen3", 4, 64): (0.34, 0.45),
    ("qwen3", 8, 64): (0.33, 0.44),
    ("llama3", 8, 64): (0.28, 0.37),
    ("deepseek-v3", 8, 64): (0.29, 0.38),
}
REVIEW_SIMT_B1 = {("qwen3", 8): 0.87, ("llama3", 8): 0.86, ("deepseek-v3", 8): 0.90}
REVIEW_TOLERANCE = 0.03  # DESIGN.md "The bandwidth model": the review's figures are given to 2 digits


@pytest.mark.parametrize("key", list(REVIEW_TABLE), ids=lambda k: f"{k[0]}-tp{k[1]}-B{k[2]}")
def test_agrees_with_the_review_table(key):
    model, tp, b = key
    lo, hi = REVIEW_TABLE[key]
    s = pm.engine_shape(model, tp)
    v = pm.reg_variant(b)  # the review described the register kernel (ids 0-3), C++ auto's mma then
    at = {lat: pm.predict(pm.H200, v, s.rows, s.hidden, b, latency_s=lat).fraction_of_copy for lat in (0.6e-6, 0.8e-6)}
    assert lo - REVIEW_TOLERANCE <= at[0.8e-6] <= at[0.6e-6] <= hi + REVIEW_TOLERANCE, at
    if pm.predict(pm.H200, v, s.rows, s.hidden, b, latency_s=0.8e-6).bound == "latency":
        assert at[0.8e-6] == pytest.approx(lo, abs=REVIEW_TOLERANCE)
        assert at[0.6e-6] == pytest.approx(hi, abs=REVIEW_TOLERANCE)


@pytest.mark.parametrize("key", list(REVIEW_SIMT_B1), ids=lambda k: f"{k[0]}-tp{k[1]}")
def test_simt_at_batch_1_agrees_with_the_review(key):
    s = pm.engine_shape(*key)
    p = pm.predict(pm.H200, pm.variant("simt", nb=1), s.rows, s.hidden, 1)
    assert p.fraction_of_copy == pytest.approx(REVIEW_SIMT_B1[key], abs=REVIEW_TOLERANCE)


def test_engine_shapes_are_the_presets_rank_0_shards():
    assert pm.PRESET_SHAPES == PRESETS
    s = pm.engine_shape("qwen3", 8)
    assert (s.rows, s.padded_rows, s.hidden) == (18992, 18992, 4096)
    assert pm.engine_shape("deepseek-v3", 8).padded_rows == 16160


def test_todays_variants_follow_the_launcher_boundaries():
    # csrc/cuda/shard_argmax_launch.cuh: launch_simt NB 1/2/4/8, choose_mma_variant (tests/test_emulation.py
    # checks cpp_mma_variant against the emulation's choose_mma_variant)
    assert [pm.todays_variant("simt", b).get("nb") for b in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 8]
    batches = (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 200)
    assert [pm.cpp_mma_variant(151936, b) for b in batches] == [4, 4, 5, 5, 13, 13, 14, 14, 11, 11, 11]
    assert [pm.cpp_mma_variant(18992, b) for b in batches] == [7, 7, 8, 8, 13, 13, 15, 15, 11, 11, 11]
    # batch 33-64: 256-row tiles only where they give every SM a block (132 x 256 rows), else 192-row ones
    assert [pm.cpp_mma_variant(n, 64) for n in (132 * 256 - 255, 131 * 256)] == [14, 15]
    assert pm.cpp_mma_variant(18992, 64, sms=74) == 14
    assert pm.todays_variant("mma", 20, num_valid=18992).name == "mma/13"
    # devices whose opt-in shared memory per block holds 10 (50 KiB) but not 13 / 14 / 15, or only the
    # <= 41 KiB variants: the same sums
    mid, small = 56 * 1024, 48 * 1024
    assert [pm.cpp_mma_variant(151936, b, smem_limit=mid) for b in batches] == [4, 4, 5, 5, 6, 6, 10, 10, 11, 11, 11]
    assert [pm.cpp_mma_variant(151936, b, smem_limit=small) for b in batches] == [4, 4, 5, 5, 6, 6, 12, 12, 11, 11, 11]
    assert [pm.cpp_mma_variant(18992, b, smem_limit=small) for b in batches] == [7, 7, 8, 8, 9, 9, 12, 12, 11, 11, 11]
    # one that holds 14 (84 KiB) but not 15 (100 KiB): 14 on the tp-8 shard too
    assert pm.cpp_mma_variant(18992, 64, smem_limit=96 * 1024) == 14
    assert pm.todays_variant("mma/3", 1).mma.kind == "reg"
    # the table's candidates: C++ auto's summation-order class at that batch
    assert pm.mma_candidates(1) == pm.mma_candidates(32) == (4, 5, 6, 7, 8, 9, 13)
    assert pm.mma_candidates(33) == pm.mma_candidates(1024) == (10, 11, 12, 14, 15)
    # the TMA twins (sm_90+): timed by --tune, never a table's candidates
    assert pm.mma_tma_twins(1) == pm.mma_tma_twins(32) == (16, 17, 18)
    assert pm.mma_tma_twins(33) == pm.mma_tma_twins(1024) == (19, 20)
    for b in batches:
        assert pm.cpp_mma_variant(18992, b) in pm.mma_candidates(b)
        assert pm.cpp_mma_variant(151936, b) in pm.mma_candidates(b)


def _header_table():
    """The MmaVariant table of csrc/cuda/shard_argmax_launch.cuh: the LAM_MMA_* lines, the comment rows."""
    src = (ROOT / "csrc" / "cuda" / "shard_argmax_launch.cuh").read_text()
    reg = {int(a[0]): tuple(map(int, a[1:])) for a in re.findall(r"^LAM_MMA_REG\((\d+), (\d+), (\d+)\)", src, re.M)}
    pipe = {  # LAM_MMA_PIPE and LAM_MMA_TMA (the TMA twins) take the same parameters
        int(a[0]): tuple(map(int, a[1:]))
        for a in re.findall(r"^LAM_MMA_(?:PIPE|TMA)\((\d+), " + ", ".join([r"(\d+)"] * 7) + r"\)", src, re.M)
    }
    rows = {
        int(m[0]): (m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]))
        for m in re.findall(
            r"^//\s+(\d+)\s+(reg|pipe|split|tma)\s+(\d+)\s+\S+\s+(\d+)\s+(\d+)\s+.*?\s(\d+)\s+(\d+) / \d+", src, re.M
        )
    }
    count = int(re.search(r"constexpr int kNumMmaVariants = (\d+);", src).group(1))
    return reg, pipe, rows, count


def test_mma_variant_mirror_matches_the_header():
    """predict.MMA_VARIANTS (and DEFAULT_REGISTERS' mma rows, the validator's id range) = the MmaVariant
    table of shard_argmax_launch.cuh: template parameters, rows, threads, shared memory, sm_90a registers."""
    from localargmax import dispatch
    from localargmax._validation import NUM_MMA_VARIANTS

    reg, pipe, rows, count = _header_table()
    src = (ROOT / "csrc" / "cuda" / "shard_argmax_launch.cuh").read_text()
    assert count == len(pm.MMA_VARIANTS) == NUM_MMA_VARIANTS == len(dispatch.MMA_VARIANT_IDS)
    assert sorted({**reg, **pipe}) == list(range(count)) == sorted(rows)
    for m in pm.MMA_VARIANTS:
        assert m.template == (reg if m.kind == "reg" else pipe)[m.id], m
        kind, nt, tile_rows, threads, smem, regs = rows[m.id]
        assert (kind == "reg") == (m.kind == "reg") and (kind == "split") == (m.sk > 1), m
        assert (kind == "tma") == (m.kind == "tma") == bool(re.search(rf"^LAM_MMA_TMA\({m.id},", src, re.M)), m
        assert (m.nt, m.rows, m.threads, m.smem) == (nt, tile_rows, threads, smem), m
        assert pm.DEFAULT_REGISTERS[f"mma/{m.id}"] == regs, m


def test_proposed_variant_meeting_the_bar_exists_and_is_reported():
    # the model's guidance: at every engine shape and batch <= 64 some proposed variant reaches the bar
    for s in pm.engine_shapes():
        for b in (1, 16, 64):
            p = pm.smallest_meeting_bar(pm.H200, s.rows, s.hidden, b)
            assert p is not None and p.fraction_of_copy >= pm.BAR_FRACTION, (s, b)
            assert not p.variant.built


# --- registers from the build ----------------------------------------------------------------------------

MMA1 = "_ZN11localargmax4cuda12_GLOBAL__N_123shard_argmax_mma_kernelI13__nv_bfloat16Li1ELi2EEEvPKT_lS6_lS6_PKfliilNS0_11ShardReduceE"  # noqa: E501
MMA8_HALF = "_ZN11localargmax4cuda12_GLOBAL__N_123shard_argmax_mma_kernelI6__halfLi8ELi1EEEvPKT_lS6_lS6_PKfliilNS0_11ShardReduceE"  # noqa: E501
PIPE7 = "_ZN11localargmax4cuda12_GLOBAL__N_128shard_argmax_mma_pipe_kernelI13__nv_bfloat16Li1ELi2ELi2ELi2ELi2ELi4ELi4EEEvPKT_lS6_lS6_PKfliilNS0_11ShardReduceE"  # noqa: E501
SIMT1 = "_ZN11localargmax4cuda12_GLOBAL__N_119shard_argmax_kernelI13__nv_bfloat16Li1ELi8ELb0ELb0EEEvNS0_18ShardArgmaxProblemIT_EE"  # noqa: E501
SIMT1_TOPK = SIMT1.replace("Lb0ELb0E", "Lb1ELb0E")  # <T, NB, kVec, TOPK, LSE>
SIMT1_LSE = SIMT1.replace("Lb0ELb0E", "Lb0ELb1E")  # the log-partition build: not argmax's registers

CUOBJDUMP = f"""
Fatbin elf code:
================
arch = sm_80
code version = [1,8]

Resource usage:
 Function {MMA1}:REG:96 STACK:0 SHARED:256 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_90a
code version = [1,8]

Resource usage:
 Function {MMA1}:REG:168 STACK:0 SHARED:256 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {MMA8_HALF}:REG:200 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {PIPE7}:
 REG:77 STACK:0 SHARED:36992 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {SIMT1}:REG:40 STACK:0 SHARED:64 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {SIMT1_TOPK}:REG:90 STACK:0 SHARED:640 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {SIMT1_LSE}:REG:99 STACK:0 SHARED:640 LOCAL:0 CONSTANT[0]:464 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

PTXAS_LOG = f"""
ptxas info    : Compiling entry function '{MMA1}' for 'sm_100'
ptxas info    : Used 99 registers, used 1 barriers, 256 bytes smem, 464 bytes cmem[0]
ptxas info    : Compiling entry function '{MMA1}' for 'sm_90a'
ptxas info    : Function properties for {MMA1}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 152 registers, used 1 barriers, 256 bytes smem, 464 bytes cmem[0]
"""


def test_parse_registers_from_cuobjdump_keeps_the_arch_and_argmax_kernels():
    regs = pm.parse_registers(CUOBJDUMP, "sm_90")
    # (cuobjdump 13 puts REG: on the line after the function's name)
    assert regs == {"mma/0": 168, "mma/3": 200, "mma/7": 77, "simt(nb=1)": 40}
    assert pm.parse_registers(CUOBJDUMP, "sm_80") == {"mma/0": 96}


def test_parse_registers_from_ptxas_lines():
    assert pm.parse_registers(PTXAS_LOG, "sm_90") == {"mma/0": 152}


def test_read_registers_falls_back_to_defaults_and_says_so(tmp_path):
    regs = pm.read_registers(root=tmp_path)
    assert regs.by_variant == pm.DEFAULT_REGISTERS and regs.source.startswith("defaults")
    log = tmp_path / "build" / "cmake-py312" / "build.log"
    log.parent.mkdir(parents=True)
    log.write_text(PTXAS_LOG)
    regs = pm.read_registers(root=tmp_path)
    assert regs.by_variant["mma/0"] == 152 and "build.log" in regs.source
    dump = tmp_path / "dump.txt"
    dump.write_text(CUOBJDUMP)
    assert pm.read_registers(path=str(dump)).by_variant["simt(nb=1)"] == 40


def test_the_built_kernels_have_the_default_registers():
    """DEFAULT_REGISTERS (the model's figures without a CUDA build) are what
    this checkout's CUDA build reports on sm_90a, simt rows included."""
    regs = pm.read_registers()
    if not regs.source.startswith(("cuobjdump", "ptxas")):
        pytest.skip(f"no CUDA build of localargmax to read ({regs.source})")
    assert regs.by_variant == pm.DEFAULT_REGISTERS, regs.source


def test_built_registers_change_the_prediction():
    s = pm.engine_shape("qwen3", 8)
    fewer = pm.Registers({**pm.DEFAULT_REGISTERS, "mma/0": 120}, "test")  # 4 CTAs per SM instead of 3
    a = pm.predict(pm.H200, MMA_NT1, s.rows, s.hidden, 1)
    b = pm.predict(pm.H200, MMA_NT1, s.rows, s.hidden, 1, registers=fewer)
    assert (a.ctas_per_sm, b.ctas_per_sm) == (3, 4) and b.regs_source == "test"


# --- --predict ---------------------------------------------------------------------------------------------


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "localargmax.bench", *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_predict_cli_prints_and_writes_predicted_rows(tmp_path):
    out = tmp_path / "p.json"
    proc = run_cli("--predict", "--model", "qwen3", "--tp", "8", "--batch", "1,64", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "PREDICTED" in proc.stdout.splitlines()[0]
    assert "bar (>= 0.88 of copy at batch <= 64)" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "predicted" and "PREDICTED" in doc["label"]
    assert {r["label"] for r in doc["rows"]} == {"PREDICTED"}
    assert {(r["shape"], r["tp"], r["batch"]) for r in doc["rows"]} == {("qwen3", 8, 1), ("qwen3", 8, 64)}
    paths = {r["variant"] for r in doc["rows"] if r["batch"] == 1 and r["built"]}
    assert paths == {"simt(nb=1)", "gemm", *(f"mma/{i}" for i in range(len(pm.MMA_VARIANTS)))}
    roles = {r["variant"]: r["role"] for r in doc["rows"] if r["batch"] == 64 and r["built"]}
    assert "auto" in roles["mma/15"]  # choose_mma_variant on the tp-8 shard: 192-row tiles
    assert sum("auto" in r for r in roles.values()) == 1
    assert sum("table" in r for r in roles.values()) == 1
    assert "mma/10" in proc.stdout and "pred_us" in proc.stdout
    for r in doc["rows"]:
        assert r["fraction_of_copy_range"][0] <= r["fraction_of_copy"] <= r["fraction_of_copy_range"][1]
    assert doc["registers_source"] and doc["sources"]["latency_s"]


def test_predict_help_teaches_and_bad_combinations_exit_2():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "--predict" in proc.stdout and "Little's law" in proc.stdout
    assert run_cli("--predict", "--tune").returncode == 2
    assert run_cli("--predict", "--kernel-only").returncode == 2


def test_committed_predicted_results_are_the_models():
    # bench/results/predicted_h200.json is what --predict gives now (regenerate it with its command)
    doc = json.loads(RESULTS.read_text())
    registers = pm.Registers(doc["registers"], doc["registers_source"])
    fresh, _ = predict_cli.predicted_doc(
        pm.H200, pm.engine_shapes(), list(pm.ENGINE_BATCHES), registers, doc["command"]
    )
    assert doc["model"]["sha256"] == pm.model_sha256(), f"re-run: {doc['command']}"
    assert fresh["rows"] == doc["rows"] and fresh["summary"] == doc["summary"], f"re-run: {doc['command']}"


def test_committed_results_show_the_bar_status():
    doc = json.loads(RESULTS.read_text())
    rows = [s for s in doc["summary"] if s["batch"] <= pm.BAR_MAX_BATCH]
    assert {(s["shape"], s["tp"]) for s in rows} == {(m, tp) for m, tp in pm.ENGINE_SHAPES}
    assert all(math.isfinite(s["table"]["us"]) for s in rows)
    assert all(s["proposed_min"]["of_copy"] >= pm.BAR_FRACTION for s in rows)
