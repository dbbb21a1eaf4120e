// Which kernel instantiation, grid and block a shard problem gets. Shared by
// the CUDA launchers (shard_argmax_cuda.cu) and the host emulation
// (csrc/emu/emu_kernels.cpp), so the emulation runs exactly the
// instantiations and grids the GPU runs. Torch-free.
//
// launch(name, kernel, grid, block, args...) starts kernel<<<grid, block>>>(args...).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "device_runtime.cuh"
#include "logits_to_keys_kernel.cuh"
#include "shard_argmax_kernel.cuh"
#include "shard_argmax_mma_kernel.cuh"

namespace localargmax {
namespace cuda {
namespace {

constexpr int64_t kMaxGridY = 65535;  // grid y (and z) limit; the kernels walk further chunks in a loop

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline dim3 grid_of(int64_t blocks_x, int64_t chunks, int64_t max_grid_y) {
  return dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(std::min(chunks, max_grid_y)));
}

// Whether the CUDA-core kernel can read 16-byte vectors (else one element).
template <typename T>
bool simt_vectorized(const ShardArgmaxProblem<T>& p) {
  constexpr int kVec = 16 / sizeof(T);
  return p.hidden_size % kVec == 0 && p.ldh % kVec == 0 && p.ldw % kVec == 0 && aligned16(p.hidden) &&
         aligned16(p.weight);
}

// Whether the tensor-core kernel takes the problem's shapes and alignment (it
// also needs a bf16 / fp16 weight and sm_80+, checked by the caller).
template <typename T>
bool mma_takes(const ShardArgmaxProblem<T>& p) {
  return p.hidden_size % 8 == 0 && p.ldw % 8 == 0 && p.ldh % 8 == 0 && aligned16(p.weight) && aligned16(p.hidden);
}

// Blocks (grid x) of the CUDA-core kernel: one per kRowsPerBlock rows.
template <typename T>
int64_t simt_blocks(const ShardArgmaxProblem<T>& p) {
  return (p.num_valid + kRowsPerBlock - 1) / kRowsPerBlock;
}

template <typename T, int NB, bool TOPK, bool LSE, typename Launch>
void launch_simt_lse(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y) {
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid = grid_of(simt_blocks(p), (p.batch + NB - 1) / NB, max_grid_y);
  const dim3 block(kWarps * 32);
  if (simt_vectorized(p)) {
    launch("shard_argmax_kernel", shard_argmax_kernel<T, NB, kVec, TOPK, LSE>, grid, block, p);
  } else {
    launch("shard_argmax_kernel", shard_argmax_kernel<T, NB, 1, TOPK, LSE>, grid, block, p);
  }
}

// LSE (the log-partition states) when p.out.block_partition is set.
template <typename T, int NB, bool TOPK, typename Launch>
void launch_simt_nb(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y) {
  if (p.out.block_partition != nullptr) return launch_simt_lse<T, NB, TOPK, true>(p, launch, max_grid_y);
  launch_simt_lse<T, NB, TOPK, false>(p, launch, max_grid_y);
}

constexpr int kPartitionThreads = 128;

// The per-block log-partition states [blocks, batch] -> pairs [batch, 2].
template <typename Launch>
void launch_merge_partition(const PartitionState* block_partition, int64_t blocks, int64_t batch,
                            const float* temperature, float* pairs, Launch&& launch) {
  const dim3 grid(static_cast<unsigned>((batch + kPartitionThreads - 1) / kPartitionThreads));
  launch("merge_partition_kernel", merge_partition_kernel, grid, dim3(kPartitionThreads), block_partition, blocks,
         batch, temperature, pairs);
}

// The CUDA-core kernel ("simt"): NB batch rows per pass.
template <typename T, bool TOPK, typename Launch>
void launch_simt(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y = kMaxGridY) {
  if (p.batch <= 1) return launch_simt_nb<T, 1, TOPK>(p, launch, max_grid_y);
  if (p.batch <= 2) return launch_simt_nb<T, 2, TOPK>(p, launch, max_grid_y);
  if (p.batch <= 4) return launch_simt_nb<T, 4, TOPK>(p, launch, max_grid_y);
  return launch_simt_nb<T, 8, TOPK>(p, launch, max_grid_y);
}

// ---- The tensor-core variants ----
//
// Every instantiation the mma path can launch, by id (the names a dispatch
// table uses). "reg": shard_argmax_mma_kernel<T, NT, KV> (register double
// buffering, one k step of loads in flight per warp; forced only). "pipe" /
// "split": shard_argmax_mma_pipe_kernel<T, NT, MT, WM, SK, KC, ST, MINB>
// (cp.async stages; rows = WM * MT * 16 per block, WM * SK warps, SK-way
// split-K inside the tile, KC 32-element chunks per stage and partial sums per
// logit, ST stages, __launch_bounds__ minimum of MINB blocks per SM). "tma":
// shard_argmax_mma_pipe_kernel<..., MINB, true>, the twin of a pipe variant
// (same parameters, so the same sums, bit for bit) whose weight tiles come by
// bulk tensor copy (TMA) on an mbarrier per stage instead of cp.async; the
// dynamic shared memory also holds the ST mbarriers (+ 8 ST bytes). sm_90+
// only: run_mma refuses them below (ValueError), auto never picks them (a
// GPU --tune run decides whether a dispatch table should). Shared
// memory per block ("smem B", MmaVariant::kSmem): reg the static block_best
// (8 NT * 4 warps * 8 bytes); pipe the stages in dynamic shared memory
// (kDynamicSmem = ST * KC * (rows + 8 NT) * 64, pipe_stage_bytes, the
// launch's size; past 48 KiB the CUDA launcher raises the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize) + the static block_best (8 NT *
// WM * 8). It must fit the device's opt-in limit per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB H100 / H200, 163 KiB A100,
// 99 KiB sm_86 / sm_89): auto never picks a variant that does not, a forced
// one raises ValueError. Registers (ptxas, sm_90a / sm_80, bf16 and fp16
// alike; no spills: tests/test_build.py) and the weight bytes in flight per
// block ((ST - 1) * KC * rows * 64):
//
// id  kind   NT  batch   rows thr  SK KC ST MINB  smem B  regs 90a/80  in flight  order class
//  0  reg     1  1-8      128 128   -  -  -   -     256   150 / 162    4 KiB    reg
//  1  reg     2  9-16     128 128   -  -  -   -     512   150 / 142    4 KiB    reg
//  2  reg     4  17-32    128 128   -  -  -   -    1024   128 / 126    2 KiB    reg
//  3  reg     8  33-64    128 128   -  -  -   -    2048   214 / 208    2 KiB    reg
//  4  pipe    1  1-8       64  64   1  2  4   6   36992   109 / 102    24 KiB    KC=2
//  5  pipe    2  9-16      64  64   1  2  4   5   41216   126 / 122    24 KiB    KC=2
//  6  pipe    4  17-32     64  64   1  2  3   6   37376   162 / 154    16 KiB    KC=2
//  7  split   1  1-8       64 128   2  2  4   4   36992     88 / 86    24 KiB    KC=2 (= 4)
//  8  split   2  9-16      64 128   2  2  4   4   41216     82 / 78    24 KiB    KC=2 (= 5)
//  9  split   4  17-32     64 128   2  2  3   4   37376     90 / 86    16 KiB    KC=2 (= 6)
// 10  pipe    8  33-64    128 128   1  1  4   3   51200   146 / 138    24 KiB    KC=1
// 11  pipe   16  65-128    64 128   1  1  3   4   40960   126 / 124    8 KiB    KC=1 (MT = 1)
// 12  pipe    8  33-64     64  64   1  1  4   6   33792   146 / 138    12 KiB    KC=1 (= 10)
// 13  pipe    4  17-32    128 128   1  2  3   3   62464   162 / 154    32 KiB    KC=2 (= 6)
// 14  pipe    8  33-64    256 128   1  1  4   2   83968   242 / 242    48 KiB    KC=1 (= 10, MT = 4)
// 15  pipe    8  33-64    192 128   1  1  6   2  100352   206 / 198    60 KiB    KC=1 (= 10, MT = 3)
// 16  tma     1  1-8       64  64   1  2  4   6   37024   108 / 78     24 KiB    KC=2 (= 4, TMA twin)
// 17  tma     2  9-16      64  64   1  2  4   5   41248   124 / 66     24 KiB    KC=2 (= 5, TMA twin)
// 18  tma     4  17-32    128 128   1  2  3   3   62488   160 / 113    32 KiB    KC=2 (= 13, TMA twin)
// 19  tma     8  33-64    256 128   1  1  4   2   84000   240 / 237    48 KiB    KC=1 (= 14, TMA twin)
// 20  tma     8  33-64    192 128   1  1  6   2  100400   204 / 191    60 KiB    KC=1 (= 15, TMA twin)
// (the TMA rows' sm_80 registers are those of a body whose copies trap: they
// never run there; sm_100: 118 / 128 / 144 / 216 / 201)
//
// Batches past a variant's 8 NT rows run in passes (grid y), each streaming
// the weight again; auto takes 11 past 64 (the op's C++ auto takes the gemm
// path from batch 65 on CUDA), 13 at 17-32, and at 33-64 14 where its
// 256-row tiles give every SM a block, else 15 (192-row tiles: 4/3 the blocks,
// for the tp-8 shards), where the device's opt-in shared memory holds them. The ops force one variant with
// path="mma/<id>".
template <int ID>
struct MmaVariant;

// The family names launch_mma gives the launch functor (the CUDA launcher
// starts the pipelined family with programmatic dependent launch).
constexpr const char* kMmaRegFamily = "shard_argmax_mma_kernel";
constexpr const char* kMmaPipeFamily = "shard_argmax_mma_pipe_kernel";

#define LAM_MMA_REG(ID, NT, KV)                                                            \
  template <>                                                                              \
  struct MmaVariant<ID> {                                                                  \
    static constexpr int kNT = NT, kRows = kMmaRowsPerBlock, kThreads = kMmaWarps * 32;   \
    static constexpr int kDynamicSmem = 0, kSmem = kMmaWarps * NT * 8 * 8;                 \
    static constexpr bool kPipe = false, kTma = false;                                     \
    static constexpr const char* kFamily = kMmaRegFamily;                                  \
    template <typename T>                                                                  \
    static constexpr auto kernel() {                                                       \
      return shard_argmax_mma_kernel<T, NT, KV>;                                           \
    }                                                                                      \
  };
#define LAM_MMA_PIPE_OF(ID, NT, MT, WM, SK, KC, ST, MINB, TMA)                             \
  template <>                                                                              \
  struct MmaVariant<ID> {                                                                  \
    static constexpr int kNT = NT, kRows = WM * MT * 16, kThreads = WM * SK * 32;         \
    static constexpr int kDynamicSmem = pipe_stage_bytes<NT, MT, WM, KC, ST, TMA>();       \
    static constexpr int kSmem = kDynamicSmem + WM * NT * 8 * 8; /* + block_best */        \
    static constexpr bool kPipe = true, kTma = TMA;                                        \
    static constexpr const char* kFamily = kMmaPipeFamily;                                 \
    template <typename T>                                                                  \
    static constexpr auto kernel() {                                                       \
      return shard_argmax_mma_pipe_kernel<T, NT, MT, WM, SK, KC, ST, MINB, TMA>;           \
    }                                                                                      \
  };
#define LAM_MMA_PIPE(ID, NT, MT, WM, SK, KC, ST, MINB) LAM_MMA_PIPE_OF(ID, NT, MT, WM, SK, KC, ST, MINB, false)
#define LAM_MMA_TMA(ID, NT, MT, WM, SK, KC, ST, MINB) LAM_MMA_PIPE_OF(ID, NT, MT, WM, SK, KC, ST, MINB, true)
LAM_MMA_REG(0, 1, 2)
LAM_MMA_REG(1, 2, 2)
LAM_MMA_REG(2, 4, 1)
LAM_MMA_REG(3, 8, 1)
LAM_MMA_PIPE(4, 1, 2, 2, 1, 2, 4, 6)
LAM_MMA_PIPE(5, 2, 2, 2, 1, 2, 4, 5)
LAM_MMA_PIPE(6, 4, 2, 2, 1, 2, 3, 6)
LAM_MMA_PIPE(7, 1, 2, 2, 2, 2, 4, 4)
LAM_MMA_PIPE(8, 2, 2, 2, 2, 2, 4, 4)
LAM_MMA_PIPE(9, 4, 2, 2, 2, 2, 3, 4)
LAM_MMA_PIPE(10, 8, 2, 4, 1, 1, 4, 3)
LAM_MMA_PIPE(11, 16, 1, 4, 1, 1, 3, 4)
LAM_MMA_PIPE(12, 8, 2, 2, 1, 1, 4, 6)
LAM_MMA_PIPE(13, 4, 2, 4, 1, 2, 3, 3)
LAM_MMA_PIPE(14, 8, 4, 4, 1, 1, 4, 2)
LAM_MMA_PIPE(15, 8, 3, 4, 1, 1, 6, 2)
LAM_MMA_TMA(16, 1, 2, 2, 1, 2, 4, 6)
LAM_MMA_TMA(17, 2, 2, 2, 1, 2, 4, 5)
LAM_MMA_TMA(18, 4, 2, 4, 1, 2, 3, 3)
LAM_MMA_TMA(19, 8, 4, 4, 1, 1, 4, 2)
LAM_MMA_TMA(20, 8, 3, 4, 1, 1, 6, 2)
#undef LAM_MMA_REG
#undef LAM_MMA_PIPE
#undef LAM_MMA_TMA
#undef LAM_MMA_PIPE_OF
constexpr int kNumMmaVariants = 21;


// The dynamic shared memory bytes a launch passes (the launch functors'
// fifth argument; 0 for the kernels that take none).
struct DynamicSmem {
  int bytes;             // dynamic shared memory of the launch
  int static_bytes = 0;  // the kernel's static __shared__ (the variant table's kSmem - kDynamicSmem)
};

// A block gets 48 KiB of shared memory, static + dynamic, unless the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize was raised: past that the
// driver refuses the launch ("invalid argument"). The launchers (the CUDA one
// and the emulation's) opt in by this rule, on static + dynamic: a kernel with
// 49,152 dynamic bytes and 2,048 static ones needs it although its dynamic
// bytes alone do not exceed 48 KiB.
// What a launch of a loaded kernel may use: programmatic dependent launch
// (PDL: the pipelined kernels' griddepcontrol.wait) and the TMA copies
// (cp.async.bulk.tensor) exist only in code compiled for compute capability
// 9.0+ (__CUDA_ARCH__ >= 900), and need a device of 9.0+. An sm_80-only build
// on an H200 runs code JIT-compiled from compute_80 PTX: without the wait, PDL
// would race with the keys' zero fill, and the TMA bodies trap. ptx_version /
// binary_version: the kernel's cudaFuncAttributes (10 * major + minor; 0 if
// unknown); the code's arch is the older of the two.
struct LaunchFeatures {
  bool pdl, tma;
};
constexpr LaunchFeatures launch_features(int ptx_version, int binary_version, int device_major) {
  const int code = ptx_version > 0 && binary_version > 0 ? (ptx_version < binary_version ? ptx_version : binary_version)
                                                          : (ptx_version > 0 ? ptx_version : binary_version);
  const bool sm90 = code >= 90 && device_major >= 9;
  return LaunchFeatures{sm90, sm90};
}
static_assert(launch_features(90, 90, 9).pdl && launch_features(90, 100, 10).tma, "sm_90a code on sm_90 / sm_100");
static_assert(!launch_features(80, 90, 9).pdl && !launch_features(80, 90, 9).tma, "compute_80 PTX JIT-ed on sm_90");
static_assert(!launch_features(80, 80, 8).pdl && !launch_features(90, 90, 8).tma, "an sm_8x device");

constexpr int kDefaultSmemPerBlock = 48 * 1024;
constexpr bool needs_smem_opt_in(DynamicSmem s) { return s.static_bytes + s.bytes > kDefaultSmemPerBlock; }

// The table's shared memory, checked at compile time: every variant fits the
// largest opt-in limit and a pipelined one declares its static part (the
// launch passes it, so the opt-in rule sees static + dynamic).
template <int... I>
constexpr bool mma_table_smem_ok(std::integer_sequence<int, I...>) {
  return ((MmaVariant<I>::kSmem <= 227 * 1024 && MmaVariant<I>::kDynamicSmem <= MmaVariant<I>::kSmem &&
           (!MmaVariant<I>::kPipe || MmaVariant<I>::kSmem - MmaVariant<I>::kDynamicSmem > 0)) &&
          ...);
}
static_assert(mma_table_smem_ok(std::make_integer_sequence<int, kNumMmaVariants>{}),
              "an mma variant's shared memory does not fit 227 KiB or has no static part");

// Shared memory per block (static + dynamic) of variant `id`, or -1 for an id
// not in the table: what must fit under the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin).
template <int... I>
constexpr int mma_variant_smem_of(int id, std::integer_sequence<int, I...>) {
  int bytes = -1;
  ((bytes = id == I ? MmaVariant<I>::kSmem : bytes), ...);
  return bytes;
}
constexpr int mma_variant_smem(int id) {
  return mma_variant_smem_of(id, std::make_integer_sequence<int, kNumMmaVariants>{});
}

// Whether variant `id` copies its weight by TMA (sm_90+ only; false for an id
// not in the table).
template <int... I>
constexpr bool mma_variant_tma_of(int id, std::integer_sequence<int, I...>) {
  bool tma = false;
  ((tma = id == I ? MmaVariant<I>::kTma : tma), ...);
  return tma;
}
constexpr bool mma_variant_tma(int id) {
  return mma_variant_tma_of(id, std::make_integer_sequence<int, kNumMmaVariants>{});
}

// Whether the device takes variant `id` (its shared memory under smem_limit).
inline bool mma_variant_fits(int id, int smem_limit) {
  const int bytes = mma_variant_smem(id);
  return bytes >= 0 && bytes <= smem_limit;
}

// The opt-in shared memory per block the launchers assume when they do not
// pass the device's: 227 KiB (H100 / H200; A100 163 KiB, sm_86 / sm_89 99 KiB).
constexpr int kDefaultSmemLimit = 227 * 1024;

// SM count the launchers assume when they do not pass the device's (H200).
constexpr int kDefaultSmCount = 132;

// The variant auto picks: a pure function of shared arguments (dtype, hidden
// size, batch) and of the grid the shard gives (num_valid) on a device of
// sm_count SMs whose blocks may take smem_limit bytes of shared memory
// (cudaDevAttrMaxSharedMemoryPerBlockOptin). The summation order (DESIGN.md
// rule 5, and rule 1 across ranks) may depend on the batch only: variants
// 4-6, 7-9 and 13 sum alike (KC = 2), and 10, 12, 14 and 15 (KC = 1), so a
// rank whose num_valid is smaller (vocab padding on the last rank) and so gets
// another tile size, or a device with less shared memory, gives the same bits
// for the same row. Never decided by pointers. Never a variant whose shared
// memory exceeds smem_limit.
template <typename T>
int choose_mma_variant(int64_t hidden_size, int64_t num_valid, int64_t batch, int sm_count,
                       int smem_limit = kDefaultSmemLimit) {
  (void)hidden_size;  // (a dispatch table may use it; the pipeline takes any H % 8 == 0)
  // Fewer than 4 blocks of 64 rows per SM (e.g. tp = 8): NT <= 4 split K
  // (4 warps per 64-row tile instead of 2, the same sums); NT = 8 takes
  // 64-row tiles (twice the blocks, the same sums as 128-row ones).
  const bool small_grid = (num_valid + 63) / 64 < 4 * static_cast<int64_t>(sm_count);
  const auto fits = [&](int id) { return mma_variant_fits(id, smem_limit); };
  if (batch > 64) return 11;
  if (batch > 32) {
    // 256-row tiles when they give every SM a block; fewer (the tp-8 shards:
    // 63-75 tiles on 132 SMs) leave the kernel bound by the active SMs'
    // mma.sync rate, and 192-row tiles (4/3 the blocks) fix that while their
    // hidden re-reads stay within the L2 bandwidth (128-row ones do not).
    const bool fills = (num_valid + 255) / 256 >= static_cast<int64_t>(sm_count);
    if (fills && fits(14)) return 14;
    if (fits(15)) return 15;
    if (fits(14)) return 14;
    return small_grid || !fits(10) ? 12 : 10;
  }
  if (batch > 16 && fits(13)) return 13;  // 128-row tiles, 4 warps, 3 stages in dynamic shared memory
  const int nt = batch <= 8 ? 0 : batch <= 16 ? 1 : 2;
  return (small_grid ? 7 : 4) + nt;
}

// The fields of the weight's tensor map a TMA variant of `rows`-row tiles
// copies its boxes from (innermost first): the CUDA launcher encodes a
// CUtensorMap from them (cuTensorMapEncodeTiled: bf16 / fp16, no interleave,
// no swizzle, out-of-bounds elements zero), the emulation its TensorMap2d.
// dims {hidden_size, num_valid}: k past hidden_size and rows past num_valid
// read as zeros (the cp.async variants' zero fill); the row stride ldw *
// sizeof(T) bytes and the base are multiples of 16 (mma_takes); a box is one
// 32-element chunk of the tile's rows, 64 bytes per row: stages[st][c].
struct WeightTiles {
  const void* base;
  uint64_t dims[2];
  uint64_t row_stride_bytes;
  uint32_t box[2];
  uint32_t elem_bytes;
};
template <typename T>
WeightTiles weight_tiles(const ShardArgmaxProblem<T>& p, int rows) {
  return WeightTiles{p.weight,
                     {static_cast<uint64_t>(p.hidden_size), static_cast<uint64_t>(p.num_valid)},
                     static_cast<uint64_t>(p.ldw) * sizeof(T),
                     {static_cast<uint32_t>(kMmaChunkK), static_cast<uint32_t>(rows)},
                     static_cast<uint32_t>(sizeof(T))};
}

// A pipe variant's last argument is the weight's tensor map: encoded by the
// launch functor (launch.weight_map(tiles, dtype is bf16)) for the TMA
// variants, zeros (unused) for the others.
template <int ID, typename T, typename Launch>
void launch_mma_id(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y) {
  using V = MmaVariant<ID>;
  const dim3 grid =
      grid_of((p.num_valid + V::kRows - 1) / V::kRows, (p.batch + V::kNT * 8 - 1) / (V::kNT * 8), max_grid_y);
  // The kernel's arguments; a pipe variant takes the tensor map after them.
  const auto launch_with = [&](const auto&... tail) {
    launch(V::kFamily, V::template kernel<T>(), grid, dim3(V::kThreads),
           DynamicSmem{V::kDynamicSmem, V::kSmem - V::kDynamicSmem}, p.hidden,
           p.ldh, p.weight, p.ldw, p.bias_t, p.bias_f, p.batch, static_cast<int>(p.hidden_size),
           static_cast<int>(p.num_valid), p.vocab_start, p.out, tail...);
  };
  if constexpr (!V::kPipe) {
    launch_with();
  } else {
    WeightTensorMap map{};
    if constexpr (V::kTma)
      map = launch.weight_map(weight_tiles(p, V::kRows), std::is_same_v<T, __nv_bfloat16>,
                              reinterpret_cast<const void*>(V::template kernel<T>()));
    launch_with(map);
  }
}

template <typename T, typename Launch, int... I>
void launch_mma_variant(const ShardArgmaxProblem<T>& p, int id, Launch&& launch, int64_t max_grid_y,
                        std::integer_sequence<int, I...>) {
  ((id == I ? launch_mma_id<I>(p, launch, max_grid_y) : void()), ...);
}

// The tensor-core kernel ("mma"; T = __half or __nv_bfloat16, mma_takes(p)):
// variant `variant` of the table above, or the auto choice when < 0, on a
// device of sm_count SMs and smem_limit bytes of opt-in shared memory per
// block. The caller checks that a forced variant fits (mma_variant_fits).
template <typename T, typename Launch>
void launch_mma(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y = kMaxGridY,
                int sm_count = kDefaultSmCount, int variant = -1, int smem_limit = kDefaultSmemLimit) {
  const int id =
      variant >= 0 ? variant : choose_mma_variant<T>(p.hidden_size, p.num_valid, p.batch, sm_count, smem_limit);
  launch_mma_variant(p, id, launch, max_grid_y, std::make_integer_sequence<int, kNumMmaVariants>{});
}

// Blocks (grid x) of logits_to_keys_kernel: one per kKeysColumnsPerBlock columns.
template <typename T>
int64_t keys_blocks(const ShardArgmaxProblem<T>& p) {
  return (p.num_valid + kKeysColumnsPerBlock - 1) / kKeysColumnsPerBlock;
}

// The second half of the gemm path: float32 logits [rows, ldl] of batch rows
// b0 .. b0 + rows - 1 -> keys folded into p.out.keys.
template <typename T, typename Launch>
void launch_logits_to_keys(const float* logits, int64_t ldl, int64_t rows, int64_t b0, const ShardArgmaxProblem<T>& p,
                           Launch&& launch, int64_t max_grid_y = kMaxGridY) {
  const dim3 grid = grid_of(keys_blocks(p), rows, max_grid_y);
  if (p.out.block_partition != nullptr) {
    launch("logits_to_keys_kernel", logits_to_keys_kernel<T, true>, grid, dim3(kKeysThreads), logits, ldl, rows, b0,
           p);
  } else {
    launch("logits_to_keys_kernel", logits_to_keys_kernel<T>, grid, dim3(kKeysThreads), logits, ldl, rows, b0, p);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
