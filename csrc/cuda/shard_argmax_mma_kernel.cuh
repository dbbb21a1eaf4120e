// The tensor-core fused shard-argmax kernel (bf16 / fp16, sm_80+): one pass
// over the weight shard with mma.sync m16n8k16 (float32 accumulators), the
// argmax (or Gumbel-max sample) taken in the epilogue; logits never written.
//
// Layout: a block of kMmaWarps warps owns kMmaRowsPerBlock vocabulary rows; a
// warp owns kMmaTilesM m-tiles of 16 rows and multiplies them with NT n-tiles
// of 8 batch rows (NT * 8 batch rows per pass; more batch rows are walked by
// blockIdx.y, grid-stride). The k loop goes over chunks of 32 elements, KV
// chunks per step; per chunk each lane loads 16 bytes per weight row it holds
// and per hidden row, the next step's loads issued before the current step's
// mma (register double buffering). Which k goes into which register: common/mma_fragment.h.
// Epilogue: bias, temperature and Gumbel noise as in the CUDA-core kernel,
// pack_key, max over the warp's rows by xor-shuffles, over the block's warps
// in shared memory, then one 64-bit atomicMax per batch row and block into
// keys zeroed on the same stream.
//
// Requirements (checked by the launcher, which otherwise runs the CUDA-core
// kernel): hidden_size % 8 == 0, row strides % 8 == 0, 16-byte aligned data.
#pragma once

#include <cstdint>

#include "../common/mma_fragment.h"
#include "../common/packed_key.h"
#include "../common/philox.h"
#include "device_runtime.cuh"
#include "mma_sync.cuh"
#include "shard_argmax_kernel.cuh"

namespace localargmax {
namespace cuda {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaTilesM = 2;                          // m-tiles of 16 rows per warp
constexpr int kMmaRowsPerWarp = 16 * kMmaTilesM;
constexpr int kMmaRowsPerBlock = kMmaWarps * kMmaRowsPerWarp;

__device__ __forceinline__ unsigned int word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 16 bytes at p, or zeros when !valid. The weight is streamed (evict first)
// when one pass covers the whole batch; with several batch chunks (grid y)
// other blocks read the same rows again, so it stays cacheable. The hidden
// rows are re-read by every block (read-only cache).
__device__ __forceinline__ uint4 load_weight16(const void* p, bool valid, bool evict_first) {
  if (!valid) return make_uint4(0u, 0u, 0u, 0u);
  return evict_first ? __ldcs(reinterpret_cast<const uint4*>(p)) : __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 load_hidden16(const void* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

// NT: n-tiles of 8 batch rows per pass. KV: 32-element k chunks per loop
// step (KV * 2 KB of weight in flight per warp; more for small NT, where
// registers are free). Takes a ShardArgmaxProblem's fields one by one
// (launch_mma in shard_argmax_launch.cuh unpacks it; hidden_size and num_valid
// as int): with the struct itself as the parameter ptxas spilled 8-16 bytes
// for NT = 2 on sm_90a and NT = 4 on sm_100 (tests/test_cuda_build.py).
template <typename T, int NT, int KV>
__global__ void __launch_bounds__(kMmaWarps * 32)
    shard_argmax_mma_kernel(const T* __restrict__ hidden, int64_t ldh, const T* __restrict__ weight, int64_t ldw,
                            const T* __restrict__ bias_t, const float* __restrict__ bias_f, int64_t batch,
                            int hidden_size, int num_valid, int64_t vocab_start, ShardReduce out) {
  __shared__ unsigned long long block_best[kMmaWarps][NT * 8];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int row_base = static_cast<int>(blockIdx.x) * kMmaRowsPerBlock + warp * kMmaRowsPerWarp;
  const int64_t num_batch_chunks = (batch + NT * 8 - 1) / (NT * 8);
  const bool evict_first = num_batch_chunks == 1;

  // This lane's weight rows: m-tile mt, half h -> row row_base + 16 mt + 8 h + g.
  const T* wrow[kMmaTilesM][2];
  bool wok[kMmaTilesM][2];
#pragma unroll
  for (int mt = 0; mt < kMmaTilesM; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 16 * mt + 8 * h + g;
      wok[mt][h] = row < num_valid;
      wrow[mt][h] = weight + static_cast<int64_t>(wok[mt][h] ? row : 0) * ldw + 8 * t;
    }

  for (int64_t chunk = blockIdx.y; chunk < num_batch_chunks; chunk += gridDim.y) {
    const int64_t b0 = chunk * NT * 8;
    const T* hrow[NT];
    bool hok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t b = b0 + 8 * nt + g;
      hok[nt] = b < batch;
      hrow[nt] = hidden + (hok[nt] ? b : 0) * ldh + 8 * t;
    }

    float acc[kMmaTilesM][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMmaTilesM; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.0f;

    // A step covers KV consecutive 32-element chunks (KV 16-byte loads per
    // row and lane in flight); the chunks are multiplied in increasing k, so
    // the result does not depend on KV. Step 0's loads go out first; then,
    // per step, the next step's loads go out before this step's mma.
    // kc + 8t < hidden_size decides a lane's whole 16 bytes (hidden_size % 8
    // == 0); the rest of a chunk is zeros, adding +0.
    constexpr int kStepK = KV * kMmaChunkK;
    uint4 wcur[KV][kMmaTilesM][2], hcur[KV][NT];
#pragma unroll
    for (int v = 0; v < KV; ++v) {
      const int k = v * kMmaChunkK;
      const bool kok = k + 8 * t < hidden_size;
#pragma unroll
      for (int mt = 0; mt < kMmaTilesM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) wcur[v][mt][h] = load_weight16(wrow[mt][h] + k, kok && wok[mt][h], evict_first);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) hcur[v][nt] = load_hidden16(hrow[nt] + k, kok && hok[nt]);
    }
    for (int kc = 0; kc < hidden_size; kc += kStepK) {
      uint4 wnext[KV][kMmaTilesM][2], hnext[KV][NT];
#pragma unroll
      for (int v = 0; v < KV; ++v) {
        const int k = kc + kStepK + v * kMmaChunkK;
        const bool kok = k + 8 * t < hidden_size;
#pragma unroll
        for (int mt = 0; mt < kMmaTilesM; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) wnext[v][mt][h] = load_weight16(wrow[mt][h] + k, kok && wok[mt][h], evict_first);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) hnext[v][nt] = load_hidden16(hrow[nt] + k, kok && hok[nt]);
      }
#pragma unroll
      for (int v = 0; v < KV; ++v) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
          for (int mt = 0; mt < kMmaTilesM; ++mt) {
            const unsigned int a0 = word_of(wcur[v][mt][mma_a_row_half(0)], mma_a_word(s, 0));
            const unsigned int a1 = word_of(wcur[v][mt][mma_a_row_half(1)], mma_a_word(s, 1));
            const unsigned int a2 = word_of(wcur[v][mt][mma_a_row_half(2)], mma_a_word(s, 2));
            const unsigned int a3 = word_of(wcur[v][mt][mma_a_row_half(3)], mma_a_word(s, 3));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              mma_16816<T>(acc[mt][nt], a0, a1, a2, a3, word_of(hcur[v][nt], mma_b_word(s, 0)),
                           word_of(hcur[v][nt], mma_b_word(s, 1)));
          }
        }
      }
#pragma unroll
      for (int v = 0; v < KV; ++v) {
#pragma unroll
        for (int mt = 0; mt < kMmaTilesM; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) wcur[v][mt][h] = wnext[v][mt][h];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) hcur[v][nt] = hnext[v][nt];
      }
    }

    // Epilogue: best[nt][j] = this lane's best key for batch row b0 + 8 nt + 2t + j.
    unsigned long long best[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) best[nt][0] = best[nt][1] = kNoEntryKey;
#pragma unroll
    for (int mt = 0; mt < kMmaTilesM; ++mt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row_base + 16 * mt + mma_c_row(lane, r);
        if (row >= num_valid) continue;
        float bias = 0.0f;
        const bool has_bias = bias_f != nullptr || bias_t != nullptr;
        if (bias_f != nullptr) bias = bias_f[row];
        if (bias_t != nullptr) bias = to_float(bias_t[row]);
        const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(row);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int64_t b = b0 + 8 * nt + mma_c_col(lane, r);
          if (b >= batch) continue;
          float s = acc[mt][nt][r];
          if (has_bias) s = __fadd_rn(s, bias);
          const unsigned long long key = key_of(s, b, global_index, out);
          if (key > best[nt][r % 2]) best[nt][r % 2] = key;
        }
      }
    }
    // Max over the 8 lanes of each thread-in-group t (lanes t, t+4, ..., t+28).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int offset = 4; offset < 32; offset *= 2)
          best[nt][j] = max_key(best[nt][j], __shfl_xor_sync(0xFFFFFFFFu, best[nt][j], offset));
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) block_best[warp][8 * nt + 2 * t + j] = best[nt][j];
    }
    __syncthreads();
    fold_block_best(block_best, b0, batch, out.keys);
    __syncthreads();
  }
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
