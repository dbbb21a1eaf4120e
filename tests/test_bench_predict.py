"""The bandwidth model (bench/predict.py) and ``python -m bench.predict_cli``: hand-computed
cases, monotonicity, the review's table, the register reader, the CLI and the
committed PREDICTED results."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import predict as pm
from bench import predict_cli
from localargmax import dispatch
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
N1 = pm.mma_variant("n1_r64")  # 64-row tiles, NT = 1, 2 warps, KC = 2, ST = 4: 24 KiB in flight per CTA


def test_ctas_per_sm_by_hand():
    # 150 regs -> 152 per thread -> 4864 per warp (a multiple of 256): 65536 // 4864 = 13 warps -> 3 CTAs of 4 warps
    assert pm.ctas_per_sm(pm.H200, 128, 150, 0) == 3
    assert pm.ctas_per_sm(pm.H200, 128, 212, 0) == 2  # 6912 per warp -> 9 warps -> 2 CTAs
    assert pm.ctas_per_sm(pm.H200, 128, 110, 0) == 4  # 3584 -> 18 warps -> 4
    assert pm.ctas_per_sm(pm.H200, 256, 54, 0) == 4  # 1792 -> 36 warps -> 4 CTAs of 8 warps
    assert pm.ctas_per_sm(pm.H200, 128, 32, 100 * 1024) == 2  # shared memory: 228 KiB // (100 + 1) KiB
    assert pm.ctas_per_sm(pm.H200, 64, 16, 0) == 32  # the CTA limit


def test_littles_law_latency_bound_by_hand():
    # n1_r64: 114 registers -> 120 x 32 = 3840 per warp -> 17 warps -> 8 CTAs of 2; shared memory
    # 228 KiB // (36992 + 1024) B -> 6 per SM; on TOY (4 SMs) 24 slots. 60 tiles of 64 rows -> rounds
    # of 24, 24, 12; each CTA latency-bound: 64 x 4096 x 2 B / 24 KiB = 21.3 -> 22 + 1 fill = 23 latencies.
    p = pm.predict(TOY, N1, 64 * 60, 4096, 1)
    assert (p.ctas, p.ctas_per_sm, p.rounds) == (60, 6, 3)
    assert p.bound == "latency"
    assert p.time_s == pytest.approx(3 * 23e-6)
    assert p.in_flight_per_sm == pytest.approx(6 * 24 * 1024)
    assert p.fraction_of_copy == pytest.approx(64 * 60 * 4096 * 2 / (3 * 23e-6) / TOY.copy_Bps)


def test_littles_law_bandwidth_bound_by_hand():
    # at 1e11 B/s a full round (24 x 512 KiB = 12 MiB) takes 125.8 us > 23 us, and so does the last
    # (6 MiB, 62.9 us); at 1e12 B/s a full round (12.6 us) is shorter than its 23 latencies
    p = pm.predict(dataclasses.replace(TOY, stream_Bps=1e11), N1, 64 * 60, 4096, 1)
    assert p.bound == "bandwidth"
    assert p.time_s == pytest.approx(30 * 2**20 / 1e11)
    q = pm.predict(dataclasses.replace(TOY, stream_Bps=1e12), N1, 64 * 60, 4096, 1)
    assert q.bound == "latency" and q.time_s == pytest.approx(3 * 23e-6)


def test_wave_quantisation_costs_a_whole_cta_time():
    # 24 slots: 24 CTAs take one latency-bound round, 25 take two
    one = pm.predict(TOY, N1, 64 * 24, 4096, 1)
    two = pm.predict(TOY, N1, 64 * 25, 4096, 1)
    assert (one.rounds, two.rounds) == (1, 2)
    assert two.time_s == pytest.approx(2 * one.time_s)


def test_fixed_costs_and_batch_passes_add_up():
    spec = dataclasses.replace(TOY, launch_s=2e-6, zero_fill_s=3e-6)
    base = pm.predict(TOY, N1, 64 * 24, 4096, 8)
    # PDL: a quarter of the launch; the zero fill stays (DESIGN.md)
    assert pm.predict(spec, N1, 64 * 24, 4096, 8).time_s == pytest.approx(base.time_s + 0.5e-6 + 3e-6)
    # batch 9 with NT = 1 (8 rows per pass): two passes over the weight, 48 CTAs, two rounds
    assert pm.predict(TOY, N1, 64 * 24, 4096, 9).time_s == pytest.approx(2 * base.time_s)
    # only built kernels are modelled: a variant that is not one is refused
    with pytest.raises(ValueError, match="not a built mma config"):
        pm.predict(TOY, pm.variant("mma", stages=3, tile_rows=128), 4096, 4096, 1)


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


def test_more_registers_never_faster():
    rows, hidden = 18992, 4096
    low = pm.Registers({"mma/n1_r64": 96}, "test")
    high = pm.Registers({"mma/n1_r64": 255}, "test")
    t_low = pm.predict(pm.H200, N1, rows, hidden, 1, registers=low)
    t_high = pm.predict(pm.H200, N1, rows, hidden, 1, registers=high)
    assert t_low.ctas_per_sm > t_high.ctas_per_sm and t_low.time_s <= t_high.time_s


def test_pipelined_variant_geometry_by_hand():
    # n1_r64: 64-row tiles, NT = 1, 2 warps, KC = 2, ST = 4 -> 3 x 2 x 64 x 64 B = 24 KiB in flight per CTA;
    # 114 registers -> 120 x 32 = 3840 per warp -> 17 warps -> 8 CTAs of 2, shared memory
    # 228 KiB // (36992 + 1024) B -> 6 per SM. On TOY (4 SMs): 24 slots; 48 tiles of 64 rows -> 2 rounds,
    # each CTA latency-bound: 64 x 4096 x 2 B / 24 KiB = 21.3 -> 22 + 1 fill = 23 latencies.
    m = pm.MMA_CONFIGS["n1_r64"]
    assert (m.rows, m.threads, m.smem, m.order) == (64, 64, 36992, "KC=2")
    p = pm.predict(TOY, N1, 64 * 48, 4096, 1)
    assert (p.ctas, p.ctas_per_sm, p.rounds, p.bound) == (48, 6, 2, "latency")
    assert p.time_s == pytest.approx(2 * 23e-6)
    assert p.in_flight_per_sm == pytest.approx(6 * 24 * 1024)
    # split-K (n1_r64_sk2) splits the chunks between warp groups inside the tile: same CTAs and bytes in flight
    q = pm.predict(TOY, pm.mma_variant("n1_r64_sk2"), 64 * 48, 4096, 1)
    assert q.ctas == 48 and q.in_flight_per_sm == pytest.approx(q.ctas_per_sm * 24 * 1024)
    # batch 9 on NT = 1: two passes; on NT = 2 (n2_r64) one
    assert pm.predict(TOY, N1, 64 * 48, 4096, 9).ctas == 96
    assert pm.predict(TOY, pm.mma_variant("n2_r64"), 64 * 48, 4096, 9).ctas == 48
    # PDL: a quarter of the launch; the zero fill stays (DESIGN.md)
    spec = dataclasses.replace(TOY, launch_s=2e-6, zero_fill_s=3e-6)
    gap = pm.predict(spec, N1, 64 * 48, 4096, 1).time_s - p.time_s
    assert gap == pytest.approx(0.5e-6 + 3e-6)


def test_tma_variant_geometry_by_hand():
    # n1_r64_tma = n1_r64 with the weight tiles by TMA: the same CTAs and bytes in flight, shared memory + 4
    # mbarriers (8 B each). Per step (KC = 2, 64 rows, NT = 1, 2 warps), n1_r64: (64 + 8) x 64 x 2 / 16 / 32
    # = 18 warp-wide cp.async x 4 + 2 x 12 = 96 instructions; the twin: only the hidden rows, 8 x 64 x 2 / 16
    # / 32 = 2 x 4 + 2 x 12, + 2 boxes x 6 + 2 warps x 4 (mbarrier wait) = 52. H = 4096: 64 steps.
    m, t = pm.MMA_CONFIGS["n1_r64"], pm.MMA_CONFIGS["n1_r64_tma"]
    assert (t.tma, pm.twin_of(t), t.rows, t.threads, t.order) == (True, "n1_r64", m.rows, m.threads, m.order)
    assert t.smem == m.smem + 4 * 8 and t.dynamic_smem == m.dynamic_smem + 4 * 8
    a = pm.geometry(TOY, N1, 64 * 48, 4096, 1, 2)
    b = pm.geometry(TOY, pm.mma_variant("n1_r64_tma"), 64 * 48, 4096, 1, 2)
    assert (a.ctas, a.cta_bytes, a.cta_in_flight) == (b.ctas, b.cta_bytes, b.cta_in_flight)
    assert a.cta_instructions - b.cta_instructions == pytest.approx(64 * (96 - 52))


def test_hidden_rereads_bind_at_l2():
    # each CTA streams its 8 NT hidden rows from L2: at batch 32 on 128-row tiles (n4_r128) that is a
    # quarter of the weight bytes again; with a slow L2 the round is L2-bound at (weight + hidden) / L2 bandwidth
    spec = dataclasses.replace(TOY, l2_Bps=1e11, stream_Bps=1e12)
    p = pm.predict(spec, pm.mma_variant("n4_r128"), 128 * 12, 4096, 32)
    assert p.bound == "l2"
    assert p.time_s == pytest.approx(12 * (128 + 32) * 4096 * 2 / 1e11)


# A CUDA review's hand-worked figures (its §2.4) for the CUDA-core kernel at batch 1 (its tensor-core
# rows described the register-double-buffered kernel, deleted since).
REVIEW_SIMT_B1 = {("qwen3", 8): 0.87, ("llama3", 8): 0.86, ("deepseek-v3", 8): 0.90}
REVIEW_TOLERANCE = 0.03  # DESIGN.md "The bandwidth model": the review's figures are given to 2 digits


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
    # csrc/cuda/shard_launch.cuh: launch_simt NB 1/2/4/8, choose_mma_config (tests/test_emulation_lse.py
    # checks cpp_mma_config against the emulation's choose_mma_config)
    assert [pm.todays_variant("simt", b).get("nb") for b in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 8]
    batches = (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 200)
    big = ["n1_r64"] * 2 + ["n2_r64"] * 2 + ["n4_r128"] * 2 + ["n8_r256"] * 2 + ["n16_r64"] * 3
    small = ["n1_r64_sk2"] * 2 + ["n2_r64_sk2"] * 2 + ["n4_r128"] * 2 + ["n8_r192"] * 2 + ["n16_r64"] * 3
    assert [pm.cpp_mma_config(151936, b) for b in batches] == big
    assert [pm.cpp_mma_config(18992, b) for b in batches] == small
    # batch 33-64: 256-row tiles only where they give every SM a block (132 x 256 rows), else 192-row ones
    assert [pm.cpp_mma_config(n, 64) for n in (132 * 256 - 255, 131 * 256)] == ["n8_r256", "n8_r192"]
    assert pm.cpp_mma_config(18992, 64, sms=74) == "n8_r256"
    assert pm.todays_variant("mma", 20, num_valid=18992).name == "mma/n4_r128_tma"  # an H200 runs the TMA rows
    tma = ["n1_r64_tma"] * 2 + ["n2_r64_tma"] * 2 + ["n4_r128_tma"] * 2 + ["n8_r192"] * 2 + ["n16_r64"] * 3
    assert [pm.cpp_mma_config(18992, b, tma=True) for b in batches] == tma  # the twins of the cp.async rows
    # the log-partition keeps the cp.async rows (the TMA rows carry none): C++'s auto_takes_tma
    assert [pm.cpp_mma_config(18992, b, tma=True, log_partition=True) for b in batches] == small
    assert all(pm.twin_of(pm.MMA_CONFIGS[t]) in (c, c.replace("_sk2", "")) for t, c in zip(tma[:6], small[:6]))
    # a device whose opt-in shared memory per block holds none of the > 48 KiB configs: the same sums
    # (KC = 2 to batch 32, KC = 1 past it) from the small configs, batch 17-32 in two passes
    limited = ["n1_r64"] * 2 + ["n2_r64"] * 4 + ["n16_r64"] * 5
    assert [pm.cpp_mma_config(151936, b, smem_limit=48 * 1024) for b in batches] == limited
    # one that holds n8_r256 (84 KiB) but not n8_r192 (98 KiB): n8_r256 on the tp-8 shard too
    assert pm.cpp_mma_config(18992, 64, smem_limit=96 * 1024) == "n8_r256"
    # the table's candidates: C++ auto's summation-order class at that batch
    assert pm.mma_candidates(1) == pm.mma_candidates(32) == ("n1_r64", "n2_r64", "n1_r64_sk2", "n2_r64_sk2", "n4_r128")
    assert pm.mma_candidates(33) == pm.mma_candidates(1024) == ("n8_r256", "n8_r192", "n16_r64", "n16_r64_w2")
    # the TMA twins (sm_90+): timed by --tune, never a table's candidates
    assert pm.mma_tma_twins(1) == pm.mma_tma_twins(32) == ("n1_r64_tma", "n2_r64_tma", "n4_r128_tma")
    assert pm.mma_tma_twins(33) == pm.mma_tma_twins(1024) == ("n8_r256_tma", "n8_r192_tma")
    for b in batches:
        assert pm.cpp_mma_config(18992, b) in pm.mma_candidates(b)
        assert pm.cpp_mma_config(151936, b) in pm.mma_candidates(b)


def test_the_model_reads_the_c_table():
    """predict.MMA_CONFIGS is the table _C exports (csrc/cuda/mma_configs.h), nothing mirrored; the
    register defaults are its REGS90 column; rows, threads and shared memory follow the fields."""
    from localargmax import _C

    rows = _C._mma_configs()
    assert [r[0] for r in rows] == list(pm.MMA_CONFIGS) and len(rows) == 14
    assert {k: v for k, v in pm.DEFAULT_REGISTERS.items() if k.startswith("mma/")} == {
        f"mma/{r[0]}": r[10] for r in rows
    }
    for m in pm.MMA_CONFIGS.values():
        assert m.rows == 16 * m.wm * m.mt and m.threads == 32 * m.wm * m.wn * m.sk, m
        assert m.batch_rows == 8 * m.nt * m.wn <= m.threads, m
        assert m.dynamic_smem == m.st * m.kc * (m.rows + m.batch_rows) * 64 + (8 * m.st if m.tma else 0), m
        assert m.static_smem == 8 * m.batch_rows * m.wm and m.smem <= 227 * 1024, m
        assert m.topk == (not m.tma and m.mt * m.nt <= 16), m  # MmaConfig::topk: cp.async, kMmaRoomyWarpTiles


# --- registers from the build ----------------------------------------------------------------------------

_PIPE = "_ZN11localargmax4cuda12_GLOBAL__N_128shard_argmax_mma_pipe_kernelI{}EEvPKT_lS6_lS6_PKfliilNS0_11ShardReduceE15WeightTensorMap"  # noqa: E501
MMA1 = _PIPE.format("13__nv_bfloat16Li1ELi2ELi2ELi1ELi1ELi2ELi4ELi6ELb0E")  # n1_r64 <T, NT, MT, WM, WN .. MINB, TMA>
MMA8_HALF = _PIPE.format("6__halfLi8ELi4ELi4ELi1ELi1ELi1ELi4ELi2ELb0E")  # n8_r256, fp16
PIPE7 = _PIPE.format("13__nv_bfloat16Li1ELi2ELi2ELi1ELi2ELi2ELi4ELi4ELb0E")  # n1_r64_sk2
TMA1 = _PIPE.format("13__nv_bfloat16Li1ELi2ELi2ELi1ELi1ELi2ELi4ELi6ELb1E")  # n1_r64_tma
SIMT1 = "_ZN11localargmax4cuda12_GLOBAL__N_119shard_argmax_kernelI13__nv_bfloat16Li1ELi8ELb0ELb0EEEvNS0_18ShardArgmaxProblemIT_EE"  # noqa: E501
SIMT1_TOPK = SIMT1.replace("Lb0ELb0E", "Lb1ELb0E")  # <T, NB, kVec, TOPK, LSE>
SIMT1_LSE = SIMT1.replace("Lb0ELb0E", "Lb0ELb1E")  # the log-partition build: not argmax's registers


def _fatbin(arch: str, usage: dict) -> str:
    """One elf section of ``cuobjdump --dump-resource-usage`` (nvcc 13's layout): {function: registers}."""
    rows = "".join(
        f" Function {name}:REG:{regs} STACK:0 SHARED:256 LOCAL:0 CONSTANT[0]:464\n" for name, regs in usage.items()
    )
    return f"\nFatbin elf code:\n================\narch = {arch}\ncode version = [1,8]\n\nResource usage:\n{rows}"


CUOBJDUMP = (
    _fatbin("sm_80", {MMA1: 96})
    + _fatbin("sm_90a", {MMA1: 168, MMA8_HALF: 200, TMA1: 70, SIMT1: 40, SIMT1_TOPK: 90, SIMT1_LSE: 99})
    + f" Function {PIPE7}:\n REG:77 STACK:0 SHARED:36992 LOCAL:0 CONSTANT[0]:464\n"  # REG: on the next line (nvcc 13)
)

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
    assert regs == {"mma/n1_r64": 168, "mma/n8_r256": 200, "mma/n1_r64_sk2": 77, "mma/n1_r64_tma": 70, "simt(nb=1)": 40}
    assert pm.parse_registers(CUOBJDUMP, "sm_80") == {"mma/n1_r64": 96}


def test_parse_registers_skips_a_build_with_separate_log_partition_kernels():
    old = _PIPE.format("13__nv_bfloat16Li1ELi2ELi2ELi1ELi1ELi2ELi4ELi6ELb0ELb1E")  # <..., TMA, LSE>: an older build
    assert pm.parse_registers(_fatbin("sm_90a", {old: 171}), "sm_90") == {}


def test_parse_registers_from_ptxas_lines():
    assert pm.parse_registers(PTXAS_LOG, "sm_90") == {"mma/n1_r64": 152}


def test_read_registers_falls_back_to_defaults_and_says_so(tmp_path):
    regs = pm.read_registers(root=tmp_path)
    assert regs.by_variant == pm.DEFAULT_REGISTERS and regs.source.startswith("defaults")
    log = tmp_path / "build" / "cmake-py312" / "build.log"
    log.parent.mkdir(parents=True)
    log.write_text(PTXAS_LOG)
    regs = pm.read_registers(root=tmp_path)
    assert regs.by_variant["mma/n1_r64"] == 152 and "build.log" in regs.source
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
    # 72 registers, 4 warps: 72 x 32 per warp -> 28 warps -> 7 CTAs per SM, shared memory 6 of 37 KiB -> 6;
    # 100: 104 x 32 -> 19 warps -> 4
    n1 = pm.mma_variant("n1_r64_sk2")
    more = pm.Registers({**pm.DEFAULT_REGISTERS, "mma/n1_r64_sk2": 100}, "test")
    a = pm.predict(pm.H200, n1, s.rows, s.hidden, 1)
    b = pm.predict(pm.H200, n1, s.rows, s.hidden, 1, registers=more)
    assert (a.regs, a.ctas_per_sm, b.ctas_per_sm) == (72, 6, 4) and b.regs_source == "test"


# --- python -m bench.predict_cli ---------------------------------------------------------------------------


def run_cli(*args, module="bench.predict_cli"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_predict_cli_prints_and_writes_predicted_rows(tmp_path):
    out = tmp_path / "p.json"
    proc = run_cli("--model", "qwen3", "--tp", "8", "--batch", "1,64", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "PREDICTED" in proc.stdout.splitlines()[0]
    assert "bar (>= 0.88 of copy at batch <= 64)" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "predicted" and "PREDICTED" in doc["label"]
    assert {r["label"] for r in doc["rows"]} == {"PREDICTED"}
    assert {(r["shape"], r["tp"], r["batch"]) for r in doc["rows"]} == {("qwen3", 8, 1), ("qwen3", 8, 64)}
    paths = {r["variant"] for r in doc["rows"] if r["batch"] == 1}
    assert paths == {"simt(nb=1)", "gemm", *(f"mma/{name}" for name in pm.MMA_CONFIGS)}
    roles = {r["variant"]: r["role"] for r in doc["rows"] if r["batch"] == 64}
    assert "auto" in roles["gemm"]  # C++ auto from batch 17 (measured on an H200)
    assert sum("auto" in r for r in roles.values()) == 1
    assert sum("model" in r for r in roles.values()) == 1
    assert "mma/n16_r64" in proc.stdout and "pred_us" in proc.stdout
    for r in doc["rows"]:
        assert r["fraction_of_copy_range"][0] <= r["fraction_of_copy"] <= r["fraction_of_copy_range"][1]
    assert doc["registers_source"] and doc["sources"]["latency_s"]


def test_predict_help_teaches_and_bad_options_exit_2():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "Little's-law" in proc.stdout and "--write-table" in proc.stdout
    for bad in (["--tp", "8"], ["--batch", "0"], ["--batch", "x"], ["--latency-ns", "-1"], ["--model", "nope"]):
        proc = run_cli(*bad)
        assert proc.returncode == 2 and bad[0] in proc.stderr, (bad, proc.stderr)


def test_the_installed_cli_points_at_the_checkout_tools():
    """``localargmax-bench --predict`` / ``--tune``: the model and the tuner are not installed; the
    installed CLI names the checkout command and exits 2; its --help names both."""
    for flag, module in (("--predict", "bench.predict_cli"), ("--tune", "bench.tune")):
        proc = run_cli(flag, module="localargmax.bench")
        assert proc.returncode == 2 and f"python -m {module} --help" in proc.stderr, proc.stderr
    assert "python -m bench.tune --help" in run_cli("--help", module="localargmax.bench").stdout


def test_write_table_cli_writes_the_models_table(tmp_path):
    """``--write-table`` writes the model's table: valid, PREDICTED, and the table the model gives
    in-process with the same registers."""
    from bench import tune

    out = tmp_path / "t.json"
    proc = run_cli("--batch", "1", "--write-table", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    dispatch.validate(doc)
    assert doc["source"] == "predicted" and "sha256" not in doc["model"]
    fresh = tune.predicted_table(pm.H200, tune.registers_of_table(doc), commit=doc["commit"])
    assert {k: v for k, v in fresh.items() if k != "commit"} == {k: v for k, v in doc.items() if k != "commit"}


def test_committed_predicted_results_are_the_models():
    # bench/results/predicted_h200.json is what the model gives now (regenerate it with its command)
    doc = json.loads(RESULTS.read_text())
    registers = pm.Registers(doc["registers"], doc["registers_source"])
    fresh, _ = predict_cli.predicted_doc(
        pm.H200, pm.engine_shapes(), list(pm.ENGINE_BATCHES), registers, doc["command"]
    )
    assert fresh["rows"] == doc["rows"] and fresh["summary"] == doc["summary"], f"re-run: {doc['command']}"


def test_committed_results_show_the_bar_status():
    doc = json.loads(RESULTS.read_text())
    rows = [s for s in doc["summary"] if s["batch"] <= pm.BAR_MAX_BATCH]
    assert {(s["shape"], s["tp"]) for s in rows} == {(m, tp) for m, tp in pm.ENGINE_SHAPES}
    assert all(math.isfinite(s["model"]["us"]) and math.isfinite(s["auto"]["us"]) for s in rows)
    assert {s["model_meets_bar"] for s in rows} <= {True, False}


def test_committed_results_have_the_log_partition_rows():
    """Each summary row carries the log-partition ops' figures: C++ auto's path for them is the
    plain op's (choose_cuda_path), its mma config the plain op's or, where that is a TMA row (which
    carries no log-partition), a cp.async row of its summation order; the 'before' figure is simt's
    below the gemm batch."""
    from bench import tune

    doc = json.loads(RESULTS.read_text())
    for s in doc["summary"]:
        lse = tune.incumbent_of(s["rows"], s["batch"], log_partition=True)
        assert s["log_partition"]["variant"] == lse and not lse.endswith("_tma"), s  # C++ auto's own
        plain = s["auto"]["variant"]
        if plain.endswith("_tma"):  # the cp.async row C++ runs without TMA: the same summation order (KC)
            assert pm.MMA_CONFIGS[lse[4:]].kc == pm.MMA_CONFIGS[plain[4:]].kc, s
        else:
            assert lse == plain, s
        before = "gemm" if s["batch"] >= dispatch.CPP_GEMM_MIN_BATCH else "simt"
        assert s["log_partition_before"]["variant"].startswith(before), s
    gemm = dispatch.CPP_GEMM_MIN_BATCH
    assert pm.cpp_auto_path(gemm - 1) == "mma" and pm.cpp_auto_path(gemm) == "gemm" and pm.cpp_auto_path(9, 8) == "gemm"


# --- the target's sampling under TP (predict_target_sampling) -----------------------------------------------

TARGET_RESULTS = ROOT / "bench" / "results" / "predicted_target_sampling_h200.json"


def test_target_sampling_by_hand():
    """qwen3 tp 2, batch 16, on a device with round numbers: each method's parts
    worked by hand from the module's formulas, and the bytes of the CPU bench's plans."""
    dev = dataclasses.replace(
        pm.H200, stream_Bps=1e12, gemm_mem_efficiency=1.0, gemm_compute_efficiency=1.0, gemm_flops=1e18,
        launch_s=1e-6, zero_fill_s=0.0, gemm_second_launch_s=0.0, link_Bps=1e11, collective_s=1e-5,
        sms=100, clock_hz=1e9,
    )  # fmt: skip
    shape = pm.engine_shape("qwen3", 2)
    rows, H, V, B = shape.padded_rows, shape.hidden, shape.vocab, 16
    got = {p.method: p for p in pm.predict_target_sampling(dev, shape, B)}
    assert tuple(got) == pm.TARGET_METHODS
    logits = rows * H * 2 / 1e12 + B * rows * 2 / 1e12 + 1e-6
    per_rank = B * rows * 2
    noise_rate = 32 * 4 * 100 * 1e9  # lane-instructions per second
    sample_full = max(B * V * pm.SAMPLER_BYTES / 1e12, B * V * pm.NOISE_INSTRUCTIONS / noise_rate) + 2e-6
    g = got["full-gather"]
    assert (g.sent_bytes, g.recv_bytes) == (per_rank, per_rank)
    assert math.isclose(g.terms["logits"], logits) and math.isclose(g.terms["exchange"], 1e-5 + per_rank / 1e11)
    assert math.isclose(g.terms["sample"], sample_full) and math.isclose(g.time_s, sum(g.terms.values()))
    b = got["batch-sharded"]  # rank 0 owns rows 0, 2, ..., 14: 8 rows; receives the other rank's 8 x rows
    assert b.recv_bytes == 8 * rows * 2 + 8 * 8 and b.sent_bytes == 8 * rows * 2 + 8 * 8
    assert math.isclose(b.terms["exchange"], (1e-5 + 8 * rows * 2 / 1e11) + (1e-5 + 64 / 1e11))
    sample_own = max(8 * V * pm.SAMPLER_BYTES / 1e12, 8 * V * pm.NOISE_INSTRUCTIONS / noise_rate) + 2e-6
    assert math.isclose(b.terms["sample"], sample_own)
    f = got["fused"]  # one key per row: 3 header words + 16 keys, padded to 16 bytes (the vLLM plugin's frames)
    assert (f.sent_bytes, f.recv_bytes) == (8 * 20, 8 * 20)
    gemm = -(-rows // 64) * 64 * H * 2 / 1e12 + 8.0 * B * -(-rows // 64) * 64 / 1e12 + 1e-6
    assert math.isclose(f.terms["logits"], gemm)
    assert math.isclose(
        f.terms["sample"], max(0.0, B * rows * pm.NOISE_INSTRUCTIONS / noise_rate - 4 * B * rows / 1e12)
    )
    assert math.isclose(f.terms["exchange"], 1e-5 + 160 / 1e11)


def test_target_sampling_tp1_exchanges_nothing_and_larger_batches_cost_more():
    one = pm.predict_target_sampling(pm.H200, pm.engine_shape("qwen3", 1), 16)
    assert all(p.terms["exchange"] == 0.0 and p.sent_bytes == 0 for p in one)
    for tp in (2, 8):
        shape = pm.engine_shape("qwen3", tp)
        for a, b in zip(pm.predict_target_sampling(pm.H200, shape, 16), pm.predict_target_sampling(pm.H200, shape, 64)):
            assert a.method == b.method and b.time_s > a.time_s and b.recv_bytes >= a.recv_bytes


def test_committed_target_sampling_results_are_the_models(tmp_path):
    """bench/results/predicted_target_sampling_h200.json is what its command writes now."""
    doc = json.loads(TARGET_RESULTS.read_text())
    out = tmp_path / "t.json"
    argv = doc["command"].split()[3:]  # after "python -m bench.predict_cli"
    json_at = argv.index("--json")
    argv[json_at + 1] = str(out)
    assert predict_cli.main(argv) == 0
    assert json.loads(out.read_text())["rows"] == doc["rows"]
    assert "--target-sampling" in doc["command"] and doc["kind"] == "predicted_target"
