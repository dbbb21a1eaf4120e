// The tensor-core kernel's named configs: the one list of what the mma path
// can launch (shard_argmax_mma_pipe_kernel<T, NT, MT, WM, WN, SK, KC, ST,
// MINB, TMA>, fused_keys_mma.cuh). Plain C++ (no CUDA, no torch): the
// launchers instantiate the rows (shard_launch.cuh), the host emulation
// runs them, and ops.cpp exports them as _C._mma_configs() for Python (the
// bandwidth model, the tuner, the tests read this table; nothing mirrors it).
//
// Fields: NT n-tiles of 8 batch rows per warp; WN warps along the batch,
// which share each weight stage: batch_rows = 8 NT WN batch rows per pass
// (batches past it run in more passes, grid y, each streaming the weight
// again); rows = WM * MT * 16 weight rows per block (WM warps along the rows,
// MT m-tiles of 16 each); WM * WN * SK warps (SK-way split-K inside the
// tile); KC 32-element k chunks per pipeline stage, which is also the number
// of float32 partial sums per logit
// (the summation order: configs of equal KC give the same bits, DESIGN.md
// rule 5); ST shared-memory stages; MINB the __launch_bounds__ minimum of
// blocks per SM; TMA: the weight tiles come by bulk tensor copy on an
// mbarrier per stage (sm_90+ only; same sums as the cp.async twin).
//
// Shared memory per block: dynamic ST * KC * (rows + batch_rows) * 64 bytes
// (+ 8 ST for TMA's mbarriers) and the static block_best (WM * batch_rows * 8
// bytes); the sum must fit the device's opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin:
// 227 KiB H100 / H200, 163 KiB A100, 99 KiB sm_86 / sm_89). REGS90: the
// registers per thread ptxas gave the bf16 instantiation for sm_90a (nvcc
// 13.0), the bandwidth model's figure when it cannot read a CUDA build; a test
// compares them with the build (tests/test_bench_predict.py), and
// tests/test_build.py checks every row for spills.
//
// topk: whether the config takes top-k (a cp.async row of at most
// kMmaRoomyWarpTiles tiles a warp; see there): shard_topk_mma_pipe_kernel.
// The rows auto chooses (choose_mma_config, below), by
// batch: n1_r64 / n1_r64_sk2 (1-8), n2_r64 / n2_r64_sk2 (9-16; the sk2 twins
// for grids of fewer than 4 blocks per SM), n4_r128 (17-32), n8_r256 /
// n8_r192 (33-64; top-k n16_r64), n16_r64 (65+ when the op runs mma there;
// top-k past 128: n16_r64_w2). Where the
// launch can run them (auto_takes_tma: sm_90 code on an sm_90+ device, no
// log-partition) auto takes the _tma twins at batch <= 32 instead (the same
// sums); a measured dispatch table names only the cp.async rows.
#pragma once

#include <cstdint>

namespace localargmax {
namespace cuda {

// The most mma tiles (MT m-tiles x NT n-tiles) a warp may hold and still have
// registers to spare for the epilogues that work per logit past the
// accumulators: the sampling noise screen (a noise estimate per logit) and
// top-k (every key to shared memory). n8_r256 / n8_r192 (32 / 24 tiles,
// 194-254 registers) do not: with the screen sm_100 put their accumulators
// on the stack; they key every logit and take no top-k (auto runs n16_r64
// for top-k there: the same KC = 1 sums). (A variable, not a function: the
// kernels read it in device code.)
constexpr int kMmaRoomyWarpTiles = 16;

struct MmaConfig {
  const char* name;
  int nt, mt, wm, wn, sk, kc, st, minb;
  bool tma;
  int regs90;

  constexpr int rows() const { return wm * mt * 16; }
  constexpr int threads() const { return wm * wn * sk * 32; }
  constexpr int batch_rows() const { return 8 * nt * wn; }
  constexpr bool topk() const { return !tma && mt * nt <= kMmaRoomyWarpTiles; }  // (shard_topk_mma_pipe_kernel)
  // The top-k kernel's __launch_bounds__ blocks per SM: half the row's (its
  // selection beside the sums, and the log-partition's epilogue after it,
  // spilled at the argmax kernel's register cap: n16_r64 at 128).
  constexpr int topk_minb() const { return minb > 1 ? minb / 2 : 1; }
  constexpr int dynamic_smem() const { return st * kc * (rows() + batch_rows()) * 64 + (tma ? 8 * st : 0); }
  constexpr int static_smem() const { return wm * batch_rows() * 8; }  // block_best
  constexpr int smem() const { return dynamic_smem() + static_smem(); }
};

// The table, grouped by summation order (configs of one KC give the same
// bits). X: one config; Y: one config and its TMA twin NAME_tma (the same
// fields, so the same sums; the weight tiles by TMA, sm_90+: auto_takes_tma),
// the twin's REGS90 last.
#define LAM_MMA_CONFIGS(X, Y)                                  \
  /* KC = 2, batch <= 32: name NT MT WM WN SK KC ST MINB REGS90 */ \
  Y(n1_r64, 1, 2, 2, 1, 1, 2, 4, 6, 110, 92)                      \
  Y(n2_r64, 2, 2, 2, 1, 1, 2, 4, 5, 126, 124)                      \
  X(n1_r64_sk2, 1, 2, 2, 1, 2, 2, 4, 4, 72)                        \
  X(n2_r64_sk2, 2, 2, 2, 1, 2, 2, 4, 4, 116)                       \
  Y(n4_r128, 4, 2, 4, 1, 1, 2, 3, 3, 158, 154)                     \
  /* KC = 1, batch > 32 */                                        \
  Y(n8_r256, 8, 4, 4, 1, 1, 1, 4, 2, 254, 236)                     \
  Y(n8_r192, 8, 3, 4, 1, 1, 1, 6, 2, 214, 194)                     \
  X(n16_r64, 16, 1, 4, 1, 1, 1, 3, 4, 128)                         \
  /* KC = 1, auto for top-k past 128 only (unmeasured): 256 batch rows a pass */ \
  X(n16_r64_w2, 16, 1, 4, 2, 1, 1, 3, 2, 128)

#define LAM_MMA_CONFIG_ROW(NAME, NT, MT, WM, WN, SK, KC, ST, MINB, REGS90) \
  MmaConfig{#NAME, NT, MT, WM, WN, SK, KC, ST, MINB, false, REGS90},
#define LAM_MMA_CONFIG_TWINS(NAME, NT, MT, WM, WN, SK, KC, ST, MINB, REGS90, TMA_REGS90) \
  LAM_MMA_CONFIG_ROW(NAME, NT, MT, WM, WN, SK, KC, ST, MINB, REGS90)                     \
  MmaConfig{#NAME "_tma", NT, MT, WM, WN, SK, KC, ST, MINB, true, TMA_REGS90},
constexpr MmaConfig kMmaConfigs[] = {LAM_MMA_CONFIGS(LAM_MMA_CONFIG_ROW, LAM_MMA_CONFIG_TWINS)};
#undef LAM_MMA_CONFIG_TWINS
#undef LAM_MMA_CONFIG_ROW
constexpr int kNumMmaConfigs = static_cast<int>(sizeof(kMmaConfigs) / sizeof(kMmaConfigs[0]));

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// The row of config `name`, or -1.
constexpr int mma_config_index(const char* name) {
  for (int i = 0; i < kNumMmaConfigs; ++i)
    if (same_name(kMmaConfigs[i].name, name)) return i;
  return -1;
}

// The row of a name the table must have: mma_config<mma_config_index("n8_r256")>()
// (a compile error when the table has no such row).
template <int I>
constexpr int mma_config() {
  static_assert(I >= 0, "no mma config of that name in LAM_MMA_CONFIGS");
  return I;
}

constexpr bool mma_configs_ok() {
  for (int i = 0; i < kNumMmaConfigs; ++i) {
    const MmaConfig& c = kMmaConfigs[i];
    if (c.smem() > 227 * 1024 || c.kc % c.sk != 0 || c.st < 2 || c.batch_rows() > c.threads()) return false;
    if (c.rows() < 64) return false;  // the log-partition states: at most the CUDA-core kernel's 64-row blocks
    if (c.tma && (c.rows() > 256 || c.st > 32)) return false;
    if (c.regs90 < 1 || c.regs90 > 255) return false;
    for (int j = 0; j < i; ++j)
      if (same_name(kMmaConfigs[j].name, c.name)) return false;
  }
  return true;
}
static_assert(mma_configs_ok(),
              "an mma config is malformed, repeats a name, exceeds 227 KiB of shared memory or has < 64 rows");

// Whether the device takes config i (its shared memory under smem_limit).
constexpr bool mma_config_fits(int i, int smem_limit) {
  return i >= 0 && i < kNumMmaConfigs && kMmaConfigs[i].smem() <= smem_limit;
}

// The opt-in shared memory per block the launchers assume when they do not
// pass the device's: 227 KiB (H100 / H200; A100 163 KiB, sm_86 / sm_89 99 KiB).
constexpr int kDefaultSmemLimit = 227 * 1024;

// SM count the launchers assume when they do not pass the device's (H200).
constexpr int kDefaultSmCount = 132;

// The config auto picks (a row of kMmaConfigs): a pure function of shared
// arguments (dtype, hidden size, batch) and of the grid the shard gives
// (num_valid) on a device of sm_count SMs whose blocks may take smem_limit
// bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin). The
// summation order (DESIGN.md rule 5, and rule 1 across ranks) may depend on
// the batch only: every row it takes at batch <= 32 has KC = 2, every row
// past 32 KC = 1, so a rank whose num_valid is smaller (vocab padding on the
// last rank) and so gets another tile size, or a device with less shared
// memory, gives the same bits for the same row. Never decided by pointers.
// Never a config whose shared memory exceeds smem_limit (the smallest rows,
// under 42 KiB, fit every sm_80+ device). _C._choose_mma_config exports it
// (the bandwidth model's C++ auto).
//
// tma: the launch can run the TMA rows (an sm_90+ device running sm_90 code,
// no log-partition): batch <= 32 then takes the TMA twins n1_r64_tma (1-8),
// n2_r64_tma (9-16), n4_r128_tma (17-32, forced mma: auto takes gemm there) —
// MEASURED on an H200 (2026-12-04, bench/results/gpu_2026-12-04: faster than
// the cp.async rows auto ran at every engine shard) — the same KC = 2 sums as
// the rows they replace, so a rank without TMA gives the same bits.
// Whether auto may run the TMA rows: the launch runs sm_90 code on an sm_90+
// device (tma_code: launch_features) and the op has no log-partition (the TMA
// rows carry none). run_mma and _C._choose_mma_config both ask it.
constexpr bool auto_takes_tma(bool tma_code, bool log_partition) { return tma_code && !log_partition; }

inline int choose_mma_config(int64_t hidden_size, int64_t num_valid, int64_t batch, int sm_count,
                             int smem_limit = kDefaultSmemLimit, bool tma = false, bool topk = false) {
  (void)hidden_size;  // (a dispatch table may use it; the pipeline takes any H % 8 == 0)
  constexpr int n1 = mma_config<mma_config_index("n1_r64")>(), n2 = mma_config<mma_config_index("n2_r64")>();
  constexpr int n1_tma = mma_config<mma_config_index("n1_r64_tma")>();
  constexpr int n2_tma = mma_config<mma_config_index("n2_r64_tma")>();
  constexpr int n4_tma = mma_config<mma_config_index("n4_r128_tma")>();
  constexpr int n1_sk2 = mma_config<mma_config_index("n1_r64_sk2")>();
  constexpr int n2_sk2 = mma_config<mma_config_index("n2_r64_sk2")>();
  constexpr int n4 = mma_config<mma_config_index("n4_r128")>(), n16 = mma_config<mma_config_index("n16_r64")>();
  constexpr int n8_256 = mma_config<mma_config_index("n8_r256")>();
  constexpr int n8_192 = mma_config<mma_config_index("n8_r192")>();
  constexpr int w2 = mma_config<mma_config_index("n16_r64_w2")>();
  static_assert(kMmaConfigs[n1].kc == 2 && kMmaConfigs[n2].kc == 2 && kMmaConfigs[n1_sk2].kc == 2 &&
                    kMmaConfigs[n2_sk2].kc == 2 && kMmaConfigs[n4].kc == 2 && kMmaConfigs[n1_tma].kc == 2 &&
                    kMmaConfigs[n2_tma].kc == 2 && kMmaConfigs[n4_tma].kc == 2,
                "batch <= 32 sums in KC = 2 order");
  static_assert(kMmaConfigs[n8_256].kc == 1 && kMmaConfigs[n8_192].kc == 1 && kMmaConfigs[n16].kc == 1,
                "batch > 32 sums in KC = 1 order");
  // Fewer than 4 blocks of 64 rows per SM (e.g. tp = 8): NT <= 2 splits K
  // (4 warps per 64-row tile instead of 2, the same sums).
  const bool small_grid = (num_valid + 63) / 64 < 4 * static_cast<int64_t>(sm_count);
  const auto fits = [&](int i) { return mma_config_fits(i, smem_limit); };
  static_assert(kMmaConfigs[n1].topk() && kMmaConfigs[n2].topk() && kMmaConfigs[n1_sk2].topk() &&
                    kMmaConfigs[n2_sk2].topk() && kMmaConfigs[n4].topk() && kMmaConfigs[n16].topk(),
                "every row auto picks for top-k takes it");
  if (topk) tma = false;  // (the top-k kernel is built for the cp.async rows only: the same sums)
  static_assert(kMmaConfigs[w2].kc == 1 && kMmaConfigs[w2].topk(), "top-k past 128: KC = 1 sums");
  // Top-k (PREDICTED, unmeasured: it has no gemm route to compare with):
  // n16_r64 from 33 (n8_r256 / n8_r192 take none), n16_r64_w2 past 128
  // batch rows (one weight pass up to 256 where n16_r64 takes two).
  if (topk && batch > 128 && fits(w2)) return w2;
  if (batch > 64 || (batch > 32 && topk)) return n16;
  if (batch > 32) {
    // 256-row tiles when they give every SM a block; fewer (the tp-8 shards:
    // 63-75 tiles on 132 SMs) leave the kernel bound by the active SMs'
    // mma.sync rate, and 192-row tiles (4/3 the blocks) fix that while their
    // hidden re-reads stay within the L2 bandwidth (128-row ones do not).
    const bool fills = (num_valid + 255) / 256 >= static_cast<int64_t>(sm_count);
    if (fills && fits(n8_256)) return n8_256;
    if (fits(n8_192)) return n8_192;
    if (fits(n8_256)) return n8_256;
    return n16;  // (KC = 1 too; one pass of 128 batch rows)
  }
  if (tma && batch > 16 && fits(n4_tma)) return n4_tma;
  if (tma && batch > 8) return n2_tma;
  if (tma) return n1_tma;
  if (batch > 16 && fits(n4)) return n4;  // 128-row tiles, 4 warps, 3 stages
  if (batch > 8) return small_grid ? n2_sk2 : n2;  // (batch 17-32 without n4: two passes)
  return small_grid ? n1_sk2 : n1;
}

// ---- The path CUDA auto takes (pick_path in shard_ops_cuda.cu) ----

enum class Path { kSimt, kMma, kGemm };

// gemm from this batch: MEASURED on an H200 (2026-12-04, bench.tune's
// timings in bench/results/gpu_2026-12-04/tune_h200.csv): the threshold with
// the smallest worst slowdown against the fastest timed path over the engine
// shards (1.07x, simt at batch 1; from 33: 1.10x, from 65: 4.4x). The KC = 1
// rows (n8_r256, n8_r192, n16_r64) ran 1.4-4.4x slower than gemm at batch
// 64-1024 on every engine shard, where the bandwidth model had them even with
// it up to 64 (docs/model.md). localargmax/dispatch.py mirrors it
// (CPP_GEMM_MIN_BATCH; tests/test_dispatch.py reads this line;
// tests/test_bench_tune.py holds auto to the measurement). (No small-shard
// simt rule: simt beat n1_r64_tma at batch 1 on the tp-8 shards by 2-7% only.)
constexpr int64_t kDefaultGemmMinBatch = 17;

// The gemm path's largest shard (weight.shape[0], padding included: every
// rank shares it): cuBLAS failed (CUBLAS_STATUS_EXECUTION_FAILED) on a GEMM of
// 2**31 - 1 weight rows on the H200; 151936 rows ran. Past this, a forced
// 'gemm' raises ValueError and auto takes mma (or simt) instead (choose_cuda_path).
constexpr int64_t kGemmMaxRows = int64_t{1} << 21;

// C++ auto (what path="auto" runs unless a measured dispatch table is set,
// localargmax/dispatch.py): float32 on simt; bf16 / fp16 top-k on mma at
// every batch where the tensor-core kernel takes the inputs (mma_takes:
// sm_80+, hidden_size and row strides multiples of 8, 16-byte aligned data),
// else simt — PREDICTED, not measured: the gemm path has no top-k, and simt
// reads the weight once per 8 batch rows where the mma rows read it once per
// batch_rows (tests/test_emulation_bytes.py); bf16 / fp16 argmax and sample on
// gemm from batch kDefaultGemmMinBatch on shards of at most kGemmMaxRows rows
// (weight.shape[0]), else on mma where it takes the inputs, else simt. The
// log-partition ops take the same path as the plain ones (it is not an input:
// every path computes it). _C._choose_cuda_path exports it.
constexpr Path choose_cuda_path(bool half, bool topk, bool mma_takes, int64_t batch, int64_t rows) {
  if (!half) return Path::kSimt;
  if (topk) return mma_takes ? Path::kMma : Path::kSimt;
  if (batch >= kDefaultGemmMinBatch && rows <= kGemmMaxRows) return Path::kGemm;
  return mma_takes ? Path::kMma : Path::kSimt;
}

}  // namespace cuda
}  // namespace localargmax
