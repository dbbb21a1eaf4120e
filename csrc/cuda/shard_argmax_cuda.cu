// CUDA implementation of localargmax::shard_argmax: one pass over the weight
// shard, the argmax taken in the same pass, the logits never written.
//
// Layout: a block of kWarps warps owns kRowsPerBlock vocabulary rows; each
// warp takes rows in turn and computes the dot product of the row with NB
// batch rows at once (the weight row is read once for all of them). A lane
// reads 16-byte vectors at k = (i * 32 + lane) * kVec; its float32 partial
// sums run over i in order, then a fixed xor-butterfly over the 32 lanes:
// the reduction order depends on k only (DESIGN.md rule 5). Each block folds
// its best key per batch row into the output with a 64-bit atomicMax; the
// output is zeroed on the same stream first. Batch rows beyond NB are walked
// by blockIdx.y in a grid-stride loop (grid y stays <= 65535).
//
// This is the CUDA-core version; tensor cores are issue #3's work.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common/packed_key.h"

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
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[8], __nv_bfloat16) {
  const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(u[i] << 16);
    out[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[8], __half) {
  const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] & 0xFFFFu)));
    out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] >> 16)));
  }
}

// NB batch rows per pass; VEC elements per lane per step (16 bytes when the
// rows are 16-byte aligned, else 1).
template <typename T, int NB, int VEC>
__global__ void __launch_bounds__(kWarps * 32)
    shard_argmax_kernel(const T* __restrict__ hidden, int64_t ldh, const T* __restrict__ weight,
                        int64_t ldw, const T* __restrict__ bias_t, const float* __restrict__ bias_f,
                        int64_t batch, int64_t hidden_size, int64_t num_valid, int64_t vocab_start,
                        unsigned long long* __restrict__ keys) {
  __shared__ unsigned long long block_best[kWarps][NB];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t num_batch_chunks = (batch + NB - 1) / NB;

  for (int64_t chunk = blockIdx.y; chunk < num_batch_chunks; chunk += gridDim.y) {
    const int64_t b0 = chunk * NB;
    unsigned long long best[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) best[j] = kNoEntryKey;

    for (int64_t row = row_begin + warp; row < row_begin + kRowsPerBlock && row < num_valid; row += kWarps) {
      float acc[NB];
#pragma unroll
      for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
      const T* wrow = weight + row * ldw;
      for (int64_t k = static_cast<int64_t>(lane) * VEC; k < hidden_size; k += 32 * VEC) {
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
              for (int e = 0; e < VEC; ++e) s = __fadd_rn(s, __fmul_rn(w[e], h[e]));
              acc[j] = s;
            }
          }
        } else {
          const float w = load_float(wrow + k);
#pragma unroll
          for (int j = 0; j < NB; ++j)
            if (b0 + j < batch) acc[j] = __fadd_rn(acc[j], __fmul_rn(w, load_float(hidden + (b0 + j) * ldh + k)));
        }
      }
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        float s = acc[j];
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, offset));
        if (bias_f != nullptr) s = __fadd_rn(s, bias_f[row]);
        if (bias_t != nullptr) s = __fadd_rn(s, to_float(bias_t[row]));
        const unsigned long long key = pack_key(s, static_cast<uint64_t>(vocab_start + row));
        if (b0 + j < batch && key > best[j]) best[j] = key;
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < NB; ++j) block_best[warp][j] = best[j];
    }
    __syncthreads();
    if (threadIdx.x < NB && b0 + threadIdx.x < batch) {
      unsigned long long m = kNoEntryKey;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = max_key(m, block_best[w][threadIdx.x]);
      if (m != kNoEntryKey) atomicMax(keys + b0 + threadIdx.x, m);
    }
    __syncthreads();
  }
}

template <typename T, int NB>
void launch_nb(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias_t,
               const at::Tensor& bias_f, int64_t vocab_start, int64_t num_valid, at::Tensor& keys) {
  const int64_t batch = hidden.size(0);
  const int64_t hidden_size = hidden.size(1);
  const int64_t ldh = hidden.stride(0);
  const int64_t ldw = weight.size(0) > 1 ? weight.stride(0) : hidden_size;
  constexpr int kVec = 16 / sizeof(T);
  const auto* hp = reinterpret_cast<const T*>(hidden.data_ptr());
  const auto* wp = reinterpret_cast<const T*>(weight.data_ptr());
  const bool vec_ok = hidden_size % kVec == 0 && ldh % kVec == 0 && ldw % kVec == 0 &&
                      reinterpret_cast<uintptr_t>(hp) % 16 == 0 && reinterpret_cast<uintptr_t>(wp) % 16 == 0;
  const int64_t blocks_x = (num_valid + kRowsPerBlock - 1) / kRowsPerBlock;
  TORCH_CHECK(blocks_x <= 0x7FFFFFFF, "shard_argmax: too many vocabulary rows (", num_valid, ")");
  const int64_t chunks = (batch + NB - 1) / NB;
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  const dim3 block(kWarps * 32);
  const T* bt = bias_t.defined() ? reinterpret_cast<const T*>(bias_t.data_ptr()) : nullptr;
  const float* bf = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  auto* kp = reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (vec_ok) {
    shard_argmax_kernel<T, NB, kVec><<<grid, block, 0, stream>>>(hp, ldh, wp, ldw, bt, bf, batch, hidden_size,
                                                                 num_valid, vocab_start, kp);
  } else {
    shard_argmax_kernel<T, NB, 1><<<grid, block, 0, stream>>>(hp, ldh, wp, ldw, bt, bf, batch, hidden_size,
                                                              num_valid, vocab_start, kp);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias_t,
            const at::Tensor& bias_f, int64_t vocab_start, int64_t num_valid, at::Tensor& keys) {
  const int64_t batch = hidden.size(0);
  if (batch <= 1) return launch_nb<T, 1>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys);
  if (batch <= 2) return launch_nb<T, 2>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys);
  if (batch <= 4) return launch_nb<T, 4>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys);
  return launch_nb<T, 8>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys);
}

at::Tensor shard_argmax_cuda(const at::Tensor& hidden_in, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, int64_t vocab_start, int64_t num_valid) {
  check_shard_argmax_args(hidden_in, weight, bias, vocab_start, num_valid);
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t batch = hidden_in.size(0);
  at::Tensor keys = at::zeros({batch}, hidden_in.options().dtype(at::kLong));  // memset on the current stream
  if (batch == 0 || num_valid == 0) return keys;
  const at::Tensor hidden = hidden_in.stride(1) == 1 ? hidden_in : hidden_in.contiguous();
  at::Tensor bias_t, bias_f;
  if (bias.has_value()) {
    if (bias->scalar_type() == at::kFloat && weight.scalar_type() != at::kFloat)
      bias_f = bias->contiguous();
    else
      bias_t = bias->contiguous();
  }
  switch (weight.scalar_type()) {
    case at::kFloat: launch<float>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys); break;
    case at::kHalf: launch<__half>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys); break;
    case at::kBFloat16: launch<__nv_bfloat16>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, keys); break;
    default: TORCH_CHECK_TYPE(false, "shard_argmax: unsupported dtype ", weight.scalar_type());
  }
  return keys;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(localargmax, CUDA, m) { m.impl("shard_argmax", &cuda::shard_argmax_cuda); }

}  // namespace localargmax
