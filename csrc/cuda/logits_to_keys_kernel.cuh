// The second half of the large-batch "gemm" path (see shard_ops_cuda.cu):
// float32 logits [batch, num_valid] written by cuBLAS -> one packed key per
// batch row, folded into out.keys with a 64-bit atomicMax. Bias, temperature
// and Gumbel noise are applied exactly as the fused kernel applies them, so
// the two paths differ only in how the dot products were summed. vLLM's noise
// (out.noise_seed) is applied here alone: on CUDA it takes this path.
#pragma once

#include <cstdint>

#include "../common/packed_key.h"
#include "../common/philox.h"
#include "device_runtime.cuh"
#include "fused_keys_simt.cuh"

namespace localargmax {
namespace cuda {
namespace {

constexpr int kKeysThreads = 256;
constexpr int kKeysPerThread = 16;
constexpr int kKeysColumnsPerBlock = kKeysThreads * kKeysPerThread;

// A PartitionState across the warp: xor butterfly, the same bits on every
// lane (partition_merge(a, b) and (b, a) add the same two terms).
__device__ __forceinline__ PartitionState warp_merge_partition(PartitionState s, float t) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const PartitionState other{__shfl_xor_sync(0xFFFFFFFFu, s.best_key, offset),
                               __shfl_xor_sync(0xFFFFFFFFu, s.ref, offset),
                               __shfl_xor_sync(0xFFFFFFFFu, s.others, offset)};
    partition_merge(s, other, t);
  }
  return s;
}

// grid.x: column blocks of kKeysColumnsPerBlock logits; grid.y walks the
// batch rows of this chunk (grid-stride, y <= 65535). logits: [rows, ldl],
// batch rows b0 .. b0 + rows - 1 of p (for out.keys, temperatures and the
// Philox subsequence); p's hidden and weight are not read. Philox sampling
// (no LSE) goes through the noise screen (screened_sample_key). LSE: also the
// block's log-partition state per batch row (out.block_partition
// [gridDim.x, batch]): each thread's columns in ascending order, the warp's
// threads by butterfly, the block's warps in order.
template <typename T, bool LSE = false>
__global__ void __launch_bounds__(kKeysThreads)
    logits_to_keys_kernel(const float* __restrict__ logits, int64_t ldl, int64_t rows, int64_t b0,
                          const ShardArgmaxProblem<T> p) {
  const T* __restrict__ bias_t = p.bias_t;
  const float* __restrict__ bias_f = p.bias_f;
  const int64_t num_valid = p.num_valid;  // 64-bit column arithmetic: a block's columns may pass 2**31
  const int64_t vocab_start = p.vocab_start;
  const ShardReduce& out = p.out;
  __shared__ unsigned long long warp_best[kKeysThreads / 32];
  __shared__ PartitionState warp_partition[LSE ? kKeysThreads / 32 : 1];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kKeysColumnsPerBlock;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t b = b0 + r;
    const float* row = logits + r * ldl;
    unsigned long long best = kNoEntryKey;
    PartitionState part = partition_init();
    const float t = LSE ? partition_temperature(b, out) : 1.0f;
    const auto logit = [&](int64_t col) {
      float s = row[col];
      if (bias_f != nullptr) s = __fadd_rn(s, bias_f[col]);
      if (bias_t != nullptr) s = __fadd_rn(s, to_float(bias_t[col]));
      return s;
    };
    // Philox sampling without the log-partition: the noise screen, its floor
    // the max of keys[b] and of the warp's sample_key_floor (a first pass,
    // which keeps each logit's noise estimate).
    const float t_noise = !LSE && out.noise_seed == nullptr ? noise_temperature(b, out) : 0.0f;
    unsigned long long floor = kNoEntryKey;
    float noise[kKeysPerThread];
    if (t_noise > 0.0f) {
      floor = key_so_far(out.keys, b);
#pragma unroll
      for (int i = 0; i < kKeysPerThread; ++i) {
        const int64_t col = col0 + i * kKeysThreads + static_cast<int64_t>(threadIdx.x);
        noise[i] = 0.0f;
        if (col < num_valid) {
          const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(col);
          noise[i] = noise_estimate(b, global_index, out);
          floor = max_key(floor, sample_key_floor(logit(col), t_noise, noise[i], global_index));
        }
      }
      floor = warp_max_key(floor);
    }
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      const int64_t col = col0 + i * kKeysThreads + static_cast<int64_t>(threadIdx.x);
      if (col < num_valid) {
        float s = logit(col);
        if constexpr (LSE) s = transform_logit(s, out.scale, out.soft_cap);
        const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(col);
        const unsigned long long key =
            out.noise_seed != nullptr ? key_of<true>(s, b, global_index, out)
            : t_noise > 0.0f ? screened_sample_key(s, t_noise, noise[i], b, global_index, out, max_key(floor, best))
                             : key_of(s, b, global_index, out);
        if constexpr (LSE) partition_add(part, s, key, t);
        best = max_key(best, key);
      }
    }
    best = warp_max_key(best);
    if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
    if constexpr (LSE) {
      part = warp_merge_partition(part, t);
      if (threadIdx.x % 32 == 0) warp_partition[threadIdx.x / 32] = part;
    }
    __syncthreads();
    if constexpr (LSE) {
      if (threadIdx.x == 32) {  // another warp than the keys' fold below
        PartitionState acc = partition_init();
#pragma unroll
        for (int w = 0; w < kKeysThreads / 32; ++w) partition_merge(acc, warp_partition[w], t);
        out.block_partition[static_cast<int64_t>(blockIdx.x) * p.batch + b] = acc;
      }
    }
    if (threadIdx.x < 32) {
      best = threadIdx.x < kKeysThreads / 32 ? warp_best[threadIdx.x] : kNoEntryKey;
      best = warp_max_key(best);
      if (threadIdx.x == 0 && best != kNoEntryKey) atomicMax(out.keys + b, best);
    }
    __syncthreads();
  }
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
