// CUDA implementation of localargmax::merge_keys: one launch of
// merge_keys_kernel.cuh, one thread per batch row: unsigned max over ranks,
// decode, optional d2t lookup.
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
#include "../merge_frames.h"
#include "merge_keys_kernel.cuh"
#include "step_kernels.cuh"

namespace localargmax {
namespace cuda {
namespace {

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
  const int64_t blocks = (batch + kMergeThreads - 1) / kMergeThreads;
  merge_keys_kernel<<<static_cast<unsigned>(blocks), kMergeThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const unsigned long long*>(keys.data_ptr<int64_t>()), tp, batch, d2t.defined(),
      d2t.defined() ? d2t.data_ptr<int64_t>() : nullptr, d2t.defined() ? d2t.size(0) : 0,
      ids.data_ptr<int64_t>(), values.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {ids, values};
}

// localargmax::merge_frames: one launch of merge_frames_kernel (step_kernels.cuh); a failed check clears
// the returned flag (no host synchronisation), which the step hands to torch._assert_async.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_frames_cuda(
    const at::Tensor& frames_in, int64_t batch, int64_t k, bool pairs, int64_t mode,
    const std::optional<at::Tensor>& d2t_in, int64_t target_vocab, const std::optional<at::Tensor>& temperature_in,
    bool log_probs, bool log_odds, bool sign_flipped, bool raise_errors) {
  TORCH_CHECK_VALUE(!raise_errors, "merge_frames: raise_errors needs the host (CPU tensors); on CUDA the step "
                    "checks the returned flag with torch._assert_async");
  MergeOutputs out = merge_frames_outputs(frames_in, batch, k, pairs, mode, d2t_in, temperature_in, log_probs,
                                          log_odds, sign_flipped);
  const c10::cuda::CUDAGuard guard(frames_in.device());
  const at::Tensor frames = frames_2d(frames_in, batch, k, pairs);
  const at::Tensor d2t = d2t_in.has_value() ? d2t_in->contiguous() : at::Tensor();
  const at::Tensor temperature = temperature_in.has_value() ? temperature_in->contiguous() : at::Tensor();
  const MergeFrames a =
      merge_frames_args(frames, batch, k, pairs, mode, d2t, target_vocab, temperature, sign_flipped, out);
  merge_frames_kernel<<<1, kStepThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a, out.ok.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out.ids, out.values, out.log_probs, out.log_odds, out.ok};
}

// localargmax::log_probs_from_pairs: one launch of log_probs_from_pairs_kernel (step_kernels.cuh).
at::Tensor log_probs_from_pairs_cuda(const at::Tensor& values_in, const at::Tensor& pairs_in,
                                     const std::optional<at::Tensor>& temperature_in) {
  at::Tensor out = log_probs_from_pairs_output(values_in, pairs_in, temperature_in);
  const int64_t batch = values_in.size(0);
  if (batch == 0 || out.numel() == 0) return out;
  const c10::cuda::CUDAGuard guard(values_in.device());
  const at::Tensor values = values_in.contiguous(), pairs = pairs_in.contiguous();
  const at::Tensor temperature = temperature_in.has_value() ? temperature_in->contiguous() : at::Tensor();
  const int64_t blocks = (batch + kStepThreads - 1) / kStepThreads;
  log_probs_from_pairs_kernel<<<static_cast<unsigned>(blocks), kStepThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      values.data_ptr<float>(), pairs.data_ptr<float>(),
      temperature.defined() ? temperature.data_ptr<float>() : nullptr, pairs.size(0), batch,
      values.dim() == 2 ? values.size(1) : 1, out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(localargmax, CUDA, m) {
  m.impl("merge_keys", &cuda::merge_keys_cuda);
  m.impl("merge_frames", &cuda::merge_frames_cuda);
  m.impl("log_probs_from_pairs", &cuda::log_probs_from_pairs_cuda);
}

}  // namespace localargmax
