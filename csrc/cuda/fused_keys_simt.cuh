// The CUDA-core fused shard-argmax kernel (see shard_ops_cuda.cu for the
// layout), and the problem struct every shard kernel takes. Kept free of torch
// headers so that it compiles on its own, for the GPU and for the host
// emulation (device_runtime.cuh).
#pragma once

#include <utility>

#include <cstdint>

#include "device_runtime.cuh"

#include "../common/log_partition.h"
#include "../common/packed_key.h"
#include "../common/philox.h"
#include "../common/vllm_noise.h"

namespace localargmax {
namespace cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerBlock = 64;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
  return to_float(p[0]);
}

// The 16 bytes of a uint4 as 16 / sizeof(T) floats, by bit operations (taking
// the address of the vector would put it in local memory).
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[4], float) {
  out[0] = __uint_as_float(v.x);
  out[1] = __uint_as_float(v.y);
  out[2] = __uint_as_float(v.z);
  out[3] = __uint_as_float(v.w);
}
__device__ __forceinline__ void unpack_pair(unsigned int u, float& lo, float& hi, __nv_bfloat16) {
  lo = __uint_as_float(u << 16);
  hi = __uint_as_float(u & 0xFFFF0000u);
}
__device__ __forceinline__ void unpack_pair(unsigned int u, float& lo, float& hi, __half) {
  lo = __half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xFFFFu)));
  hi = __half2float(__ushort_as_half(static_cast<unsigned short>(u >> 16)));
}
template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[8], T tag) {
  unpack_pair(v.x, out[0], out[1], tag);
  unpack_pair(v.y, out[2], out[3], tag);
  unpack_pair(v.z, out[4], out[5], tag);
  unpack_pair(v.w, out[6], out[7], tag);
}

// After __syncthreads: thread j < N folds the max over the block's warps of
// block_best[.][j] into keys[b0 + j] (batch rows past `batch` skipped), one
// 64-bit atomicMax per batch row and block; keys were zeroed on the stream.
template <int W, int N>
__device__ __forceinline__ void fold_block_best(const unsigned long long (&block_best)[W][N], int64_t b0,
                                                int64_t batch, unsigned long long* keys) {
  if (threadIdx.x < N && b0 + threadIdx.x < batch) {
    unsigned long long m = kNoEntryKey;
#pragma unroll
    for (int w = 0; w < W; ++w) m = max_key(m, block_best[w][threadIdx.x]);
    if (m != kNoEntryKey) atomicMax(keys + b0 + threadIdx.x, m);
  }
}

}  // namespace

// The two structs below have external linkage (outside the anonymous
// namespace) because the per-path translation units (shard_simt.cu,
// shard_mma.cu, shard_mma_topk.cu, shard_gemm.cu) export functions that take them; everything else in the kernel headers stays
// local to its translation unit.

// What the kernel reduces to (one launch, one mode); built with designated
// initializers by the op's mode (shard_ops_cuda.cu), the fields a mode does
// not use left at their defaults.
struct ShardReduce {
  unsigned long long* keys = nullptr;        // argmax / sample: [batch] keys, zeroed before the launch
  unsigned long long* block_topk = nullptr;  // top-k: [gridDim.x, batch, topk]
  int topk = 1;                              // top-k: keys kept per row (1..kMaxTopk)
  const float* temperature = nullptr;        // sample: [batch]; T <= 0 rows are greedy
  uint64_t seed = 0;                         // sample: Philox key
  uint64_t offset = 0;                       // sample: Philox subsequence of batch row 0
  // noise=vllm_noise(...) (common/vllm_noise.h), or nullptr (Philox): [batch] vLLM seeds and positions;
  // read by the gemm path's logits_to_keys_kernel only (key_of)
  const int64_t* noise_seed = nullptr;
  const int64_t* noise_pos = nullptr;
  // Log-partition (DESIGN.md, "Log-probabilities"), or nullptr: each block's
  // PartitionState per batch row, [gridDim.x, batch]; merged in block order
  // by merge_partition_kernel. With it every logit is first transformed
  // (transform_logit) and the keys carry the transformed values.
  PartitionState* block_partition = nullptr;
  // [batch] T of the sums (rows with T <= 0: 1), or nullptr (1): the
  // sampling temperature when sampling, shard_argmax_lse's own when given
  // (the log-odds at a request's T). Resolved by the host: one pointer here
  // (a device-side choice between two spilled on sm_100).
  const float* partition_temperature = nullptr;
  float scale = 1.0f;
  float soft_cap = 0.0f;  // 0: none
};

// The bias of the shard's rows, one pointer and its dtype: [num_valid]
// float32 (f32, with any weight) or in the weight's dtype; data nullptr when
// there is none. The kernels take it as two typed views (ShardArgmaxProblem).
struct Bias {
  const void* data = nullptr;
  bool f32 = false;
};

// One launch over a weight shard: the operands and what to reduce them to
// (the CUDA side of cpu::ShardArgmaxProblem, csrc/cpu/shard_argmax_tiles.h).
template <typename T>
struct ShardArgmaxProblem {
  const T* hidden;       // [batch, ldh]; rows of hidden_size elements
  int64_t ldh;           // elements between hidden rows
  const T* weight;       // [>= num_valid, ldw]; rows of hidden_size elements
  int64_t ldw;           // elements between weight rows
  // The Bias as the kernels read it (bias_of): rows in T or in float32, the
  // other nullptr (two typed pointers: ptxas spilled in the simt LSE kernels
  // on sm_100 with the untyped pointer and a flag).
  const T* bias_t;
  const float* bias_f;
  int64_t batch;
  int64_t hidden_size;
  int64_t num_valid;     // rows [0, num_valid) are the vocabulary; < 2**31 - 64
  int64_t vocab_start;   // global index of row 0
  ShardReduce out;
};

// A problem's two typed views of one bias.
template <typename T>
std::pair<const T*, const float*> bias_of(const Bias& b) {
  return {b.f32 ? nullptr : static_cast<const T*>(b.data), b.f32 ? static_cast<const float*>(b.data) : nullptr};
}

namespace {

// The key of logit s (bias already added) of batch row b at global_index:
// sampling rows (temperature T > 0) carry gumbel_score(s, T, Gumbel(seed,
// offset + b, global_index)) (common/philox.h; the CPU kernel's emit() does
// the same; VLLM_NOISE: vLLM's score vllm_gumbel_score with vLLM's noise at
// out.noise_seed[b], out.noise_pos[b], common/vllm_noise.h), greedy rows the
// logit. A row with an invalid temperature (NaN, negative, infinite) gets key 0
// everywhere, "no valid entry", which the step turns into an error (the CPU
// kernel raises before it starts). Every CUDA kernel ends in this one
// function. Only logits_to_keys_kernel (the gemm path) instantiates
// VLLM_NOISE: in the fused kernels its code cost registers they do not have
// (tests/test_build.py's no-spill gate; DESIGN.md, "vLLM's noise").
template <bool VLLM_NOISE = false>
__device__ __forceinline__ unsigned long long key_of(float s, int64_t b, uint64_t global_index,
                                                     const ShardReduce& out) {
  if (out.temperature != nullptr) {
    const float t = out.temperature[b];
    if (!valid_temperature(t)) return kNoEntryKey;
    if constexpr (VLLM_NOISE) {
      if (t > 0.0f)
        s = vllm_gumbel_score(s, t, vllm_gumbel_noise(static_cast<uint64_t>(out.noise_seed[b]),
                                                      static_cast<uint64_t>(out.noise_pos[b]), global_index));
    } else if (t > 0.0f)
      s = gumbel_score(s, t, gumbel_noise(out.seed, out.offset + static_cast<uint64_t>(b), global_index));
  }
  if constexpr (VLLM_NOISE) return vllm_score_key(s, global_index);  // vLLM's Sampler drops NaN
  return pack_key(s, global_index);
}

// Sampling's noise screen (DESIGN.md, "The noise screen"). A Philox sampling
// row's key needs gumbel_of_word's double logs; a logit whose key cannot
// reach `floor` — a key the batch row's best is known to reach: a key already
// taken in the row, keys[b] as other blocks left it, or a sample_key_floor
// of the row — never wins, so it may get kNoEntryKey instead and the row's
// best (the sample) stays key_of's. noise_estimate draws the logit's Philox
// word and estimates its noise in float (gumbel_estimate, within
// gumbel_slack); screened_sample_key takes the logs only where the estimate
// plus the slack can reach the floor (redrawing the word), for a row of
// temperature t > 0 (valid_temperature). The gemm path's vLLM noise takes
// key_of.
__device__ __forceinline__ float noise_estimate(int64_t b, uint64_t global_index, const ShardReduce& out) {
  LAM_EMU_COUNT(kNoiseWords);
  return gumbel_estimate(gumbel_word(out.seed, out.offset + static_cast<uint64_t>(b), global_index));
}
__device__ __forceinline__ unsigned long long sample_key_floor(float s, float t, float g, uint64_t global_index) {
  return pack_key(gumbel_score(s, t, g - gumbel_slack(g)), global_index);
}
__device__ __forceinline__ unsigned long long screened_sample_key(float s, float t, float g, int64_t b,
                                                                  uint64_t global_index, const ShardReduce& out,
                                                                  unsigned long long floor) {
  if (pack_key(gumbel_score(s, t, g + gumbel_slack(g)), global_index) < floor) return kNoEntryKey;
  LAM_EMU_COUNT(kNoiseLogs);
  return pack_key(gumbel_score(s, t, gumbel_noise(out.seed, out.offset + static_cast<uint64_t>(b), global_index)),
                  global_index);
}
// A sampling row's temperature when its keys take noise (valid, > 0), else 0.
__device__ __forceinline__ float noise_temperature(int64_t b, const ShardReduce& out) {
  if (out.temperature == nullptr) return 0.0f;
  const float t = out.temperature[b];
  return valid_temperature(t) && t > 0.0f ? t : 0.0f;
}
// The max of a key over the warp (xor butterfly: every lane gets it).
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long key) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) key = max_key(key, __shfl_xor_sync(0xFFFFFFFFu, key, offset));
  return key;
}

// keys[b] as the other blocks have left it so far (a volatile load: not
// cached in L1, so the atomicMax of other blocks shows): a floor for the
// screen.
__device__ __forceinline__ unsigned long long key_so_far(const unsigned long long* keys, int64_t b) {
  return *reinterpret_cast<const volatile unsigned long long*>(keys + b);
}

// The temperature of batch row b's log-partition: out.partition_temperature's
// T where T > 0, else 1 (argmax, top-k, greedy rows, no temperature).
__device__ __forceinline__ float partition_temperature(int64_t b, const ShardReduce& out) {
  const float* tp = out.partition_temperature;
  if (tp == nullptr) return 1.0f;
  const float t = tp[b];
  return t > 0.0f ? t : 1.0f;
}

// After the block's rows: each warp's lane 0 has put its states in
// warp_states[warp][.]; thread j < N merges them in warp order and writes the
// block's state of batch row b0 + j. Barriers around it, for every thread.
template <int W, int N>
__device__ __forceinline__ void store_block_partition(const PartitionState (&warp_states)[W][N], int64_t b0,
                                                      int64_t batch, const ShardReduce& out) {
  __syncthreads();
  if (threadIdx.x < N && b0 + threadIdx.x < batch) {
    const int64_t b = b0 + threadIdx.x;
    const float t = partition_temperature(b, out);
    PartitionState acc = partition_init();
#pragma unroll
    for (int w = 0; w < W; ++w) partition_merge(acc, warp_states[w][threadIdx.x], t);
    out.block_partition[static_cast<int64_t>(blockIdx.x) * batch + b] = acc;
  }
  __syncthreads();
}

// NB batch rows per pass; VEC elements per lane per step (16 bytes when the
// rows are 16-byte aligned, else 1). Products accumulate by fused multiply-add
// (__fmaf_rn: one instruction where mul + add took two; the kernel is
// instruction-bound from NB = 8). For bf16 / fp16 it gives the bits of mul +
// add, since the product of two such values is exact in float32 (bf16 products
// in float32's subnormal range aside); for fp32 it rounds once instead of twice. TOPK: each block writes the topk best
// keys of its kRowsPerBlock rows per batch row to out.block_topk instead of
// folding one key into out.keys with atomicMax. LSE: also each block's
// log-partition state per batch row (out.block_partition).
template <typename T, int NB, int VEC, bool TOPK, bool LSE = false>
// minBlocksPerSM = 2: without it ptxas spilled a 64-bit value to the stack in
// some instantiations on sm_80 / sm_100 (tests/test_cuda_build.py checks).
__global__ void __launch_bounds__(kWarps * 32, 2)
    shard_argmax_kernel(const ShardArgmaxProblem<T> p) {
  const T* __restrict__ hidden = p.hidden;
  const T* __restrict__ weight = p.weight;
  const T* __restrict__ bias_t = p.bias_t;
  const float* __restrict__ bias_f = p.bias_f;
  const int64_t ldh = p.ldh, ldw = p.ldw, batch = p.batch, hidden_size = p.hidden_size;
  const int64_t num_valid = p.num_valid, vocab_start = p.vocab_start;
  const ShardReduce& out = p.out;
  __shared__ unsigned long long block_best[kWarps][NB];
  __shared__ unsigned long long candidates[TOPK ? kRowsPerBlock : 1][NB];
  __shared__ unsigned long long lists[TOPK ? NB : 1][TOPK ? kMaxTopk : 1];
  __shared__ PartitionState warp_partition[LSE ? kWarps : 1][LSE ? NB : 1];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Row indices fit in 32 bits (the launcher checks num_valid < 2**31); 64-bit
  // row arithmetic made ptxas spill on sm_80 / sm_100.
  const int row_begin = static_cast<int>(blockIdx.x) * kRowsPerBlock;
  const int row_end = min(row_begin + kRowsPerBlock, static_cast<int>(num_valid));
  const int64_t num_batch_chunks = (batch + NB - 1) / NB;

  // Sampling (keys, no log-partition): the noise screen. Lane i keeps the
  // logits of the warp's i-th row (`kept`); after its rows the warp keys them
  // at once, one lane a row, the floor of batch row j the max of keys[b] and
  // of the lanes' sample_key_floor.
  static_assert(kRowsPerBlock / kWarps <= 32, "a lane per row of the warp");
  const bool screen = !TOPK && !LSE && out.temperature != nullptr;
  for (int64_t chunk = blockIdx.y; chunk < num_batch_chunks; chunk += gridDim.y) {
    const int64_t b0 = chunk * NB;
    unsigned long long best[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) best[j] = kNoEntryKey;
    float kept[NB] = {};
    PartitionState part[LSE ? NB : 1];
    if constexpr (LSE) {
#pragma unroll
      for (int j = 0; j < NB; ++j) part[j] = partition_init();
    }
    if constexpr (TOPK) {
      for (int i = threadIdx.x; i < kRowsPerBlock * NB; i += blockDim.x) candidates[i / NB][i % NB] = kNoEntryKey;
      __syncthreads();
    }

    for (int row = row_begin + warp, it = 0; row < row_end; row += kWarps, ++it) {
      float acc[NB];
#pragma unroll
      for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
      const T* wrow = weight + static_cast<int64_t>(row) * ldw;
      for (int k = lane * VEC; k < static_cast<int>(hidden_size); k += 32 * VEC) {
        if constexpr (VEC > 1) {
          // hidden_size % VEC == 0 on this path, so the vector is whole.
          float w[VEC];
          unpack(__ldg(reinterpret_cast<const uint4*>(wrow + k)), w, T{});
#pragma unroll
          for (int j = 0; j < NB; ++j) {
            if (b0 + j < batch) {
              float h[VEC];
              unpack(__ldg(reinterpret_cast<const uint4*>(hidden + (b0 + j) * ldh + k)), h, T{});
              float s = acc[j];
#pragma unroll
              for (int e = 0; e < VEC; ++e) s = __fmaf_rn(w[e], h[e], s);
              acc[j] = s;
            }
          }
        } else {
          const float w = load_float(wrow + k);
#pragma unroll
          for (int j = 0; j < NB; ++j)
            if (b0 + j < batch) acc[j] = __fmaf_rn(w, load_float(hidden + (b0 + j) * ldh + k), acc[j]);
        }
      }
      const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(row);
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        float s = acc[j];
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, offset));
        if (bias_f != nullptr) s = __fadd_rn(s, bias_f[row]);
        if (bias_t != nullptr) s = __fadd_rn(s, to_float(bias_t[row]));
        if (screen) {
          if (lane == it) kept[j] = s;
        } else if (b0 + j < batch) {
          if constexpr (LSE) s = transform_logit(s, out.scale, out.soft_cap);
          const unsigned long long key = key_of(s, b0 + j, global_index, out);
          // every lane holds the same s (butterfly): the warp's rows, in ascending order
          if constexpr (LSE) partition_add(part[j], s, key, partition_temperature(b0 + j, out));
          if constexpr (TOPK) {
            if (lane == 0) candidates[row - row_begin][j] = key;
          } else if (key > best[j]) {
            best[j] = key;
          }
        }
      }
    }
    if (screen) {
      const int row = row_begin + warp + lane * kWarps;  // lane's row of the warp (lanes 0-7)
      const bool mine = row < row_end;
      const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(row);
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        if (b0 + j >= batch) continue;
        const float t = noise_temperature(b0 + j, out);
        unsigned long long key = kNoEntryKey;
        if (t == 0.0f) {  // greedy or an invalid temperature: key_of
          if (mine) key = key_of(kept[j], b0 + j, global_index, out);
        } else {
          const float g = mine ? noise_estimate(b0 + j, global_index, out) : 0.0f;
          const unsigned long long floor =
              max_key(warp_max_key(mine ? sample_key_floor(kept[j], t, g, global_index) : kNoEntryKey),
                      key_so_far(out.keys, b0 + j));
          if (mine) key = screened_sample_key(kept[j], t, g, b0 + j, global_index, out, floor);
        }
        best[j] = warp_max_key(key);
      }
    }
    if constexpr (LSE) {
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < NB; ++j) warp_partition[warp][j] = part[j];
      }
      store_block_partition(warp_partition, b0, batch, out);
    }
    if constexpr (TOPK) {
      __syncthreads();
      // Thread j keeps the topk largest of the block's candidates for batch row
      // b0 + j, sorted descending, by insertion into a shared list.
      const int j = threadIdx.x;
      if (j < NB && b0 + j < batch) {
        for (int i = 0; i < out.topk; ++i) lists[j][i] = kNoEntryKey;
        for (int r = 0; r < kRowsPerBlock; ++r) {
          const unsigned long long key = candidates[r][j];
          int i = out.topk - 1;
          if (key <= lists[j][i]) continue;
          for (; i > 0 && lists[j][i - 1] < key; --i) lists[j][i] = lists[j][i - 1];
          lists[j][i] = key;
        }
        unsigned long long* dst = out.block_topk + (static_cast<int64_t>(blockIdx.x) * batch + b0 + j) * out.topk;
        for (int i = 0; i < out.topk; ++i) dst[i] = lists[j][i];
      }
      __syncthreads();
    } else {
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < NB; ++j) block_best[warp][j] = best[j];
      }
      __syncthreads();
      fold_block_best(block_best, b0, batch, out.keys);
      __syncthreads();
    }
  }
}

// The per-block states [blocks, batch] -> pairs [batch, 2] float32 (ref,
// others): thread per batch row, blocks merged in order (deterministic).
__global__ void merge_partition_kernel(const PartitionState* __restrict__ block_partition, int64_t blocks,
                                       int64_t batch, const float* __restrict__ temperature, float* __restrict__ pairs) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const float t = temperature == nullptr || !(temperature[b] > 0.0f) ? 1.0f : temperature[b];
  PartitionState acc = partition_init();
  for (int64_t i = 0; i < blocks; ++i) partition_merge(acc, block_partition[i * batch + b], t);
  pairs[2 * b] = acc.ref;
  pairs[2 * b + 1] = partition_others(acc);
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
