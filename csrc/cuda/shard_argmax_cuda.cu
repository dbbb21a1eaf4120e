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
#include <torch/library.h>

#include "../checks.h"

#include "shard_argmax_kernel.cuh"

namespace localargmax {
namespace cuda {
namespace {

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
  TORCH_CHECK_VALUE(blocks_x <= 0x7FFFFFFF, "shard_argmax: too many vocabulary rows (", num_valid, ")");
  TORCH_CHECK_VALUE(hidden_size < (int64_t{1} << 30), "shard_argmax: hidden_size must be < 2**30 on CUDA, got ",
                    hidden_size);
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
