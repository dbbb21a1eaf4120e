// CUDA implementation of localargmax::merge_keys: one launch, one thread per
// batch row: unsigned max over ranks, decode, optional d2t lookup.
// A row with no valid entry (all keys 0), or a draft id outside d2t, cannot
// raise without a host sync: it gets id -1 and value NaN instead (the CPU
// implementation raises). lm_head_argmax never produces either: its inputs
// are checked at load time (localargmax.validate_d2t, shard layouts).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "../checks.h"
#include "../common/packed_key.h"

namespace localargmax {
namespace cuda {
namespace {

__global__ void merge_keys_kernel(const unsigned long long* __restrict__ keys, int64_t tp, int64_t batch,
                                  bool has_d2t, const int64_t* __restrict__ d2t, int64_t draft_vocab,
                                  int64_t* __restrict__ ids, float* __restrict__ values) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  unsigned long long best = kNoEntryKey;
  for (int64_t r = 0; r < tp; ++r) best = max_key(best, keys[r * batch + b]);
  if (best == kNoEntryKey) {
    ids[b] = -1;
    values[b] = __uint_as_float(0x7FC00000u);
    return;
  }
  int64_t id = static_cast<int64_t>(key_index(best));
  if (has_d2t) id = id < draft_vocab ? id + d2t[id] : -1;
  ids[b] = id;
  values[b] = key_value(best);
}

std::tuple<at::Tensor, at::Tensor> merge_keys_cuda(const at::Tensor& keys_in, const std::optional<at::Tensor>& d2t_in) {
  check_merge_keys_args(keys_in, d2t_in);
  const c10::cuda::CUDAGuard guard(keys_in.device());
  const at::Tensor keys = (keys_in.dim() == 1 ? keys_in.unsqueeze(0) : keys_in).contiguous();
  const int64_t tp = keys.size(0);
  const int64_t batch = keys.size(1);
  at::Tensor ids = at::empty({batch}, keys.options());
  at::Tensor values = at::empty({batch}, keys.options().dtype(at::kFloat));
  if (batch == 0) return {ids, values};
  at::Tensor d2t;
  if (d2t_in.has_value()) d2t = d2t_in->contiguous();
  constexpr int kThreads = 256;
  const int64_t blocks = (batch + kThreads - 1) / kThreads;
  merge_keys_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const unsigned long long*>(keys.data_ptr<int64_t>()), tp, batch, d2t.defined(),
      d2t.defined() ? d2t.data_ptr<int64_t>() : nullptr, d2t.defined() ? d2t.size(0) : 0,
      ids.data_ptr<int64_t>(), values.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {ids, values};
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(localargmax, CUDA, m) { m.impl("merge_keys", &cuda::merge_keys_cuda); }

}  // namespace localargmax
