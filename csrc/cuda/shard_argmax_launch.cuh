// Which kernel instantiation, grid and block a shard problem gets. Shared by
// the CUDA launchers (shard_argmax_cuda.cu) and the host emulation
// (csrc/emu/emu_kernels.cpp), so the emulation runs exactly the
// instantiations and grids the GPU runs. Torch-free.
//
// launch(name, kernel, grid, block, args...) starts kernel<<<grid, block>>>(args...).
#pragma once

#include <algorithm>
#include <cstdint>

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

template <typename T, int NT, int KV, typename Launch>
void launch_mma_nt(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y) {
  const dim3 grid = grid_of((p.num_valid + kMmaRowsPerBlock - 1) / kMmaRowsPerBlock, (p.batch + NT * 8 - 1) / (NT * 8),
                            max_grid_y);
  launch("shard_argmax_mma_kernel", shard_argmax_mma_kernel<T, NT, KV>, grid, dim3(kMmaWarps * 32), p.hidden, p.ldh,
         p.weight, p.ldw, p.bias_t, p.bias_f, p.batch, static_cast<int>(p.hidden_size), static_cast<int>(p.num_valid),
         p.vocab_start, p.out);
}

// The tensor-core kernel ("mma"; T = __half or __nv_bfloat16, mma_takes(p)).
template <typename T, typename Launch>
void launch_mma(const ShardArgmaxProblem<T>& p, Launch&& launch, int64_t max_grid_y = kMaxGridY) {
  // (NT, KV): batch rows per pass / 8, k chunks per step (register budget).
  if (p.batch <= 8) return launch_mma_nt<T, 1, 2>(p, launch, max_grid_y);
  if (p.batch <= 16) return launch_mma_nt<T, 2, 2>(p, launch, max_grid_y);
  if (p.batch <= 32) return launch_mma_nt<T, 4, 1>(p, launch, max_grid_y);
  return launch_mma_nt<T, 8, 1>(p, launch, max_grid_y);
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
