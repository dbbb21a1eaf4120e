// Which kernel instantiation, grid and block a shard problem gets. Shared by
// the CUDA launchers (shard_ops_cuda.cu) and the host emulation
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
#include "mma_configs.h"
#include "logits_to_keys_kernel.cuh"
#include "fused_keys_simt.cuh"
#include "fused_keys_mma.cuh"

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

// ---- The tensor-core kernel: the named configs of mma_configs.h ----
//
// MmaKernel<I> is row I of kMmaConfigs as an instantiation of
// shard_argmax_mma_pipe_kernel, one per row and dtype (a cp.async row also
// computes the log-partition states when the launch passes
// out.block_partition); launch_mma runs the row auto chooses
// (choose_mma_config) or the one the op's private config keyword names.
template <int I>
struct MmaKernel {
  static constexpr MmaConfig C = kMmaConfigs[I];
  template <typename T, bool TOPK = false>
  static constexpr auto kernel() {
    if constexpr (TOPK) {
      static_assert(C.topk(), "the top-k kernel exists for the rows that take top-k (MmaConfig::topk)");
      return shard_topk_mma_pipe_kernel<T, C.nt, C.mt, C.wm, C.wn, C.sk, C.kc, C.st, C.topk_minb()>;
    } else {
      return shard_argmax_mma_pipe_kernel<T, C.nt, C.mt, C.wm, C.wn, C.sk, C.kc, C.st, C.minb, C.tma>;
    }
  }
};

// Whether row i of kMmaConfigs can compute the log-partition (the cp.async
// configs; a TMA config forced with it raises ValueError in run_mma).
constexpr bool mma_config_takes_lse(int i) { return i >= 0 && i < kNumMmaConfigs && !kMmaConfigs[i].tma; }

// The family name launch_mma gives the launch functor (the CUDA launcher
// starts it with programmatic dependent launch).
constexpr const char* kMmaPipeFamily = "shard_argmax_mma_pipe_kernel";

// The dynamic shared memory bytes a launch passes (the launch functors'
// fifth argument; 0 for the kernels that take none).
struct DynamicSmem {
  int bytes;             // dynamic shared memory of the launch
  int static_bytes = 0;  // the kernel's static __shared__ (MmaConfig::static_smem)
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

// The kernel's last argument is the weight's tensor map: encoded by the
// launch functor (launch.weight_map(tiles, dtype is bf16)) for the TMA rows,
// zeros (unused) for the others.
template <int I, bool TOPK, typename T, typename Launch>
void launch_mma_kernel(const ShardArgmaxProblem<T>& p, Launch&& launch, dim3 grid) {
  constexpr MmaConfig C = kMmaConfigs[I];
  const auto kernel = MmaKernel<I>::template kernel<T, TOPK>();
  WeightTensorMap map{};
  if constexpr (C.tma)
    map = launch.weight_map(weight_tiles(p, C.rows()), std::is_same_v<T, __nv_bfloat16>,
                            reinterpret_cast<const void*>(kernel));
  launch(kMmaPipeFamily, kernel, grid, dim3(C.threads()), DynamicSmem{C.dynamic_smem(), C.static_smem()}, p.hidden,
         p.ldh, p.weight, p.ldw, p.bias_t, p.bias_f, p.batch, static_cast<int>(p.hidden_size),
         static_cast<int>(p.num_valid), p.vocab_start, p.out, map);
}

// Row I's grid for the problem; returns its blocks along x (the rows of
// p.out.block_partition with the log-partition).
// TOPK: the top-k kernel (p.out.block_topk set), instantiated for the rows
// that take top-k only.
template <int I, bool TOPK, typename T, typename Launch>
int64_t launch_mma_config(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y) {
  constexpr MmaConfig C = kMmaConfigs[I];
  const int64_t blocks = (p.num_valid + C.rows() - 1) / C.rows();
  const dim3 grid = grid_of(blocks, (p.batch + C.batch_rows() - 1) / C.batch_rows(), max_grid_y);
  if (p.out.block_partition != nullptr && !mma_config_takes_lse(I)) return 0;  // (run_mma refuses it first)
  if ((p.out.block_topk != nullptr) != TOPK) return 0;                         // (the caller's mistake)
  if constexpr (TOPK && !C.topk()) {
    return 0;  // (also)
  } else {
    launch_mma_kernel<I, TOPK>(p, launch, grid);
    return blocks;
  }
}

template <bool TOPK, typename T, typename Launch, int... I>
int64_t launch_mma_row(const ShardArgmaxProblem<T>& p, int config, Launch&& launch, int64_t max_grid_y,
                       std::integer_sequence<int, I...>) {
  int64_t blocks = 0;
  ((config == I ? void(blocks = launch_mma_config<I, TOPK>(p, launch, max_grid_y)) : void()), ...);
  return blocks;
}

// The tensor-core kernel ("mma"; T = __half or __nv_bfloat16, mma_takes(p)):
// row `config` of kMmaConfigs, or the auto choice when < 0, on a device of
// sm_count SMs and smem_limit bytes of opt-in shared memory per block. The
// caller checks that a forced row fits (mma_config_fits) and, with the
// log-partition or top-k, takes it (mma_config_takes_lse, MmaConfig::topk).
// TOPK: the top-k kernels (for p.out.block_topk; shard_mma_topk.cu builds
// them, shard_mma.cu the others). Returns the grid's blocks along x (0:
// nothing launched).
template <bool TOPK, typename T, typename Launch>
int64_t launch_mma(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y = kMaxGridY,
                   int sm_count = kDefaultSmCount, int config = -1, int smem_limit = kDefaultSmemLimit) {
  const int i =
      config >= 0 ? config : choose_mma_config(p.hidden_size, p.num_valid, p.batch, sm_count, smem_limit, false, TOPK);
  return launch_mma_row<TOPK>(p, i, launch, max_grid_y, std::make_integer_sequence<int, kNumMmaConfigs>{});
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
