// Argument checks shared by the CPU and CUDA implementations. The Python
// wrappers (localargmax/ops.py) check the same things first and raise
// ValueError/TypeError with fuller messages; these keep direct
// torch.ops.localargmax.* calls from ever crashing or reading out of bounds.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <utility>

#include "common/packed_key.h"

namespace localargmax {

inline void check_shard_argmax_args(const at::Tensor& hidden, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias,
                                    int64_t vocab_start, int64_t num_valid) {
  TORCH_CHECK_VALUE(hidden.dim() == 2, "shard_argmax: hidden must be 2-D [batch, hidden_size], got ",
                    hidden.dim(), "-D");
  TORCH_CHECK_VALUE(weight.dim() == 2, "shard_argmax: weight must be 2-D [rows, hidden_size], got ",
                    weight.dim(), "-D");
  const auto dt = weight.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
                   "shard_argmax: weight dtype must be float32, bfloat16 or float16, got ", dt);
  TORCH_CHECK_TYPE(hidden.scalar_type() == dt, "shard_argmax: hidden dtype (", hidden.scalar_type(),
                   ") must equal weight dtype (", dt, ")");
  TORCH_CHECK_VALUE(hidden.size(1) == weight.size(1), "shard_argmax: hidden is [", hidden.size(0), ", ",
                    hidden.size(1), "] but weight is [", weight.size(0), ", ", weight.size(1),
                    "]; their last dimensions (hidden_size) must match");
  TORCH_CHECK_VALUE(weight.size(1) <= 1 || weight.stride(1) == 1,
                    "shard_argmax: weight rows must be contiguous (stride(1) == 1), got strides ",
                    weight.strides());
  TORCH_CHECK_VALUE(hidden.device() == weight.device(), "shard_argmax: hidden is on ", hidden.device(),
                    " but weight is on ", weight.device());
  TORCH_CHECK_VALUE(vocab_start >= 0, "shard_argmax: vocab_start must be >= 0, got ", vocab_start);
  TORCH_CHECK_VALUE(num_valid >= 0 && num_valid <= weight.size(0),
                    "shard_argmax: num_valid must be in [0, rows=", weight.size(0), "], got ", num_valid);
  TORCH_CHECK_VALUE(num_valid == 0 ||
                        static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(num_valid) - 1 <=
                            kMaxGlobalIndex,
                    "shard_argmax: global indices vocab_start + num_valid - 1 must be <= ", kMaxGlobalIndex,
                    " (the packed key holds 32-bit indices), got vocab_start=", vocab_start,
                    " num_valid=", num_valid);
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0),
                      "shard_argmax: bias must be 1-D [rows=", weight.size(0), "], got shape ", bias->sizes());
    TORCH_CHECK_TYPE(bias->scalar_type() == dt || bias->scalar_type() == at::kFloat,
                     "shard_argmax: bias dtype must be float32 or the weight dtype (", dt, "), got ",
                     bias->scalar_type());
    TORCH_CHECK_VALUE(bias->device() == weight.device(), "shard_argmax: bias is on ", bias->device(),
                      " but weight is on ", weight.device());
  }
}

// The logit transform of the *_lse ops: scale finite and >= 2**-126, soft_cap
// finite and 0 (none) or >= 2**-126, both finite in float32. Compared in
// double, so the caller's flush-to-zero mode cannot change the answer; a
// smaller value would be subnormal in float32, where the kernels' products
// would follow that mode.
inline void check_transform_args(double scale, double soft_cap) {
  constexpr double kMinNormal = 0x1p-126;  // FLT_MIN
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale >= kMinNormal,
                    "log-partition: scale must be a finite float >= 2**-126 (normal in float32), got ", scale);
  TORCH_CHECK_VALUE(std::isfinite(soft_cap) && (soft_cap == 0.0 || soft_cap >= kMinNormal),
                    "log-partition: soft_cap must be 0 (none) or a finite float >= 2**-126, got ", soft_cap);
  TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(scale)) && std::isfinite(static_cast<float>(soft_cap)),
                    "log-partition: scale and soft_cap must be finite in float32, got ", scale, " and ", soft_cap);
}

inline void check_topk_arg(int64_t k) {
  TORCH_CHECK_VALUE(k >= 1 && k <= kMaxTopk, "shard_topk: k must be in [1, ", kMaxTopk, "], got ", k);
}

// A per-row temperature of op `op`: [batch] float32 on the hidden states' device.
inline void check_temperature_arg(const char* op, const at::Tensor& hidden, const at::Tensor& temperature) {
  TORCH_CHECK_VALUE(temperature.dim() == 1 && temperature.size(0) == hidden.size(0), op,
                    ": temperature must be 1-D [batch=", hidden.size(0), "], got shape ", temperature.sizes());
  TORCH_CHECK_TYPE(temperature.scalar_type() == at::kFloat, op, ": temperature must be float32, got ",
                   temperature.scalar_type());
  TORCH_CHECK_VALUE(temperature.device() == hidden.device(), op, ": temperature is on ", temperature.device(),
                    " but hidden is on ", hidden.device());
}

inline void check_sample_args(const at::Tensor& hidden, const at::Tensor& temperature, int64_t offset) {
  check_temperature_arg("shard_sample", hidden, temperature);
  TORCH_CHECK_VALUE(offset >= 0, "shard_sample: offset must be >= 0, got ", offset);
}

// noise=vllm_noise(...)'s per-row tensors: both or neither, [batch] int64 on hidden's device.
inline void check_noise_args(const at::Tensor& hidden, const std::optional<at::Tensor>& noise_seed,
                             const std::optional<at::Tensor>& noise_pos) {
  TORCH_CHECK_VALUE(noise_seed.has_value() == noise_pos.has_value(),
                    "shard_sample: noise_seed and noise_pos come together (vLLM's noise), got only ",
                    noise_seed.has_value() ? "noise_seed" : "noise_pos");
  if (!noise_seed.has_value()) return;
  const std::pair<const char*, const at::Tensor*> args[] = {{"noise_seed", &*noise_seed}, {"noise_pos", &*noise_pos}};
  for (const auto& [name, t] : args) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == hidden.size(0), "shard_sample: ", name,
                      " must be 1-D [batch=", hidden.size(0), "], got shape ", t->sizes());
    TORCH_CHECK_VALUE(t->scalar_type() == at::kLong, "shard_sample: ", name, " must be int64, got ",
                      t->scalar_type());
    TORCH_CHECK_VALUE(t->device() == hidden.device(), "shard_sample: ", name, " is on ", t->device(),
                      " but hidden is on ", hidden.device());
  }
}

inline void check_merge_keys_args(const at::Tensor& keys, const std::optional<at::Tensor>& d2t) {
  TORCH_CHECK_VALUE(keys.dim() == 1 || keys.dim() == 2,
                    "merge_keys: keys must be [tp, batch] or [batch], got shape ", keys.sizes());
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "merge_keys: keys must be int64, got ",
                   keys.scalar_type());
  if (d2t.has_value()) {
    TORCH_CHECK_VALUE(d2t->dim() == 1, "merge_keys: d2t must be 1-D [draft_vocab], got shape ", d2t->sizes());
    TORCH_CHECK_TYPE(d2t->scalar_type() == at::kLong, "merge_keys: d2t must be int64, got ",
                     d2t->scalar_type());
    TORCH_CHECK_VALUE(d2t->device() == keys.device(), "merge_keys: d2t is on ", d2t->device(),
                      " but keys are on ", keys.device());
  }
}

// localargmax::step_frame's own arguments (the fused op's are checked by it).
inline void check_step_frame_args(int64_t mode, int64_t k, const std::optional<at::Tensor>& temperature,
                                  bool log_partition, bool send_pairs, bool sign_flip) {
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, "step_frame: mode must be 0 (argmax), 1 (top-k) or 2 (sample), got ",
                    mode);
  TORCH_CHECK_VALUE(k == 1 || mode == 1, "step_frame: k > 1 is top-k's (mode 1), got k=", k, " with mode ", mode);
  TORCH_CHECK_VALUE(mode != 2 || temperature.has_value(), "step_frame: sampling (mode 2) needs a temperature");
  TORCH_CHECK_VALUE(!temperature.has_value() || mode == 2 || (mode == 0 && log_partition),
                    "step_frame: a temperature is sampling's, or the argmax log-partition's");
  TORCH_CHECK_VALUE(!send_pairs || log_partition, "step_frame: send_pairs needs log_partition");
  TORCH_CHECK_VALUE(!(send_pairs && sign_flip), "step_frame: pairs do not merge by an all-reduce (sign_flip)");
}

}  // namespace localargmax
