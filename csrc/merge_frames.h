// What the CPU and CUDA merge_frames share (csrc/ops.cpp has the schema): the
// argument checks, the outputs, and the MergeFrames view of them
// (common/step_merge.h).
#pragma once

#include <ATen/ATen.h>

#include "common/step_merge.h"

namespace localargmax {

struct MergeOutputs {
  at::Tensor ids, values, log_probs, log_odds, ok;
};

inline MergeOutputs merge_frames_outputs(const at::Tensor& frames, int64_t batch, int64_t k, bool pairs, int64_t mode,
                                         const std::optional<at::Tensor>& d2t,
                                         const std::optional<at::Tensor>& temperature, bool log_probs, bool log_odds,
                                         bool sign_flipped) {
  TORCH_CHECK_VALUE(frames.dim() == 1 || frames.dim() == 2,
                    "merge_frames: frames must be [tp, words] or [words], got shape ", frames.sizes());
  TORCH_CHECK_TYPE(frames.scalar_type() == at::kLong, "merge_frames: frames must be int64, got ",
                   frames.scalar_type());
  TORCH_CHECK_VALUE(mode == kStepArgmax || mode == kStepTopk || mode == kStepSample,
                    "merge_frames: mode must be 0 (argmax), 1 (top-k) or 2 (sample), got ", mode);
  TORCH_CHECK_VALUE(batch >= 0 && k >= 1 && (k == 1 || mode == kStepTopk),
                    "merge_frames: batch must be >= 0 and k >= 1 (k > 1 for top-k only), got ", batch, ", ", k);
  const int64_t frame_len = kFrameHeader + batch * k + (pairs ? batch : 0);
  TORCH_CHECK_VALUE(frames.dim() == 2 || frames.numel() % frame_len == 0, "merge_frames: flat frames of ",
                    frames.numel(), " words are not whole frames of ", frame_len, " words");
  const int64_t tp = frames.dim() == 1 ? frames.numel() / frame_len : frames.size(0);
  const int64_t words = frames.dim() == 1 ? frame_len : frames.size(-1);
  TORCH_CHECK_VALUE(tp >= 1 && words >= frame_len,
                    "merge_frames: frames of shape ", frames.sizes(), " are too short for ", batch, " rows of ", k,
                    " keys", pairs ? " and their pairs" : "");
  TORCH_CHECK_VALUE(mode != kStepTopk || tp <= kMaxMergeRanks, "merge_frames: top-k merges at most ",
                    kMaxMergeRanks, " ranks, got ", tp);
  TORCH_CHECK_VALUE(!(log_probs || log_odds) || pairs, "merge_frames: log_probs / log_odds need the pairs");
  TORCH_CHECK_VALUE(!log_odds || mode == kStepArgmax, "merge_frames: log_odds are the argmax's");
  TORCH_CHECK_VALUE(!(pairs && sign_flipped), "merge_frames: pairs do not merge by an all-reduce");
  if (d2t.has_value()) {
    TORCH_CHECK_VALUE(d2t->dim() == 1, "d2t must be 1-D [draft_vocab_size], got shape ", d2t->sizes());
    TORCH_CHECK_TYPE(d2t->scalar_type() == at::kLong, "d2t must be int64, got ", d2t->scalar_type());
    TORCH_CHECK_VALUE(d2t->device() == frames.device(), "d2t is on ", d2t->device(), " but the keys are on ",
                      frames.device());
  }
  if (temperature.has_value()) {
    TORCH_CHECK_VALUE(temperature->dim() == 1 && temperature->size(0) == batch &&
                          temperature->scalar_type() == at::kFloat && temperature->device() == frames.device(),
                      "merge_frames: temperature must be float32 [batch=", batch, "] on ", frames.device(),
                      ", got ", temperature->scalar_type(), " ", temperature->sizes(), " on ", temperature->device());
  }
  const auto longs = frames.options();
  const auto floats = frames.options().dtype(at::kFloat);
  const std::vector<int64_t> shape =
      mode == kStepTopk ? std::vector<int64_t>{batch, k} : std::vector<int64_t>{batch};
  return {at::empty(shape, longs), at::empty(shape, floats), at::empty(log_probs ? shape : std::vector<int64_t>{0}, floats),
          at::empty({log_odds ? batch : 0}, floats), at::empty({}, frames.options().dtype(at::kBool))};
}

// frames [tp, words] (or flat: whole frames of kFrameHeader + batch * k (+ batch) words), contiguous.
inline at::Tensor frames_2d(const at::Tensor& frames, int64_t batch, int64_t k, bool pairs) {
  if (frames.dim() == 2) return frames.stride(1) == 1 ? frames : frames.contiguous();  // rows may be strided
  return frames.contiguous().view({-1, kFrameHeader + batch * k + (pairs ? batch : 0)});
}

// frames: [tp, words], words contiguous (rows at stride(0)); d2t, temperature contiguous or undefined.
inline MergeFrames merge_frames_args(const at::Tensor& frames, int64_t batch, int64_t k, bool pairs, int64_t mode,
                                     const at::Tensor& d2t, int64_t target_vocab, const at::Tensor& temperature,
                                     bool sign_flipped, MergeOutputs& out) {
  MergeFrames a;
  a.frames = reinterpret_cast<const uint64_t*>(frames.data_ptr<int64_t>());
  a.tp = frames.size(0);
  a.stride = frames.size(0) > 1 ? frames.stride(0) : frames.size(1);
  a.batch = batch;
  a.k = k;
  a.pairs = pairs;
  a.flipped = sign_flipped;
  a.mode = static_cast<int>(mode);
  a.has_d2t = d2t.defined();
  a.d2t = d2t.defined() ? d2t.data_ptr<int64_t>() : nullptr;
  a.d2t_len = d2t.defined() ? d2t.size(0) : 0;
  a.target_vocab = target_vocab;
  a.temperature = temperature.defined() ? temperature.data_ptr<float>() : nullptr;
  a.ids = out.ids.data_ptr<int64_t>();
  a.values = out.values.data_ptr<float>();
  a.log_probs = out.log_probs.numel() ? out.log_probs.data_ptr<float>() : nullptr;
  a.log_odds = out.log_odds.numel() ? out.log_odds.data_ptr<float>() : nullptr;
  return a;
}

// localargmax::log_probs_from_pairs: values [B] or [B, k] float32, pairs [tp, B, 2] float32, temperature [B]
// float32 or none, one device. Returns the output (values' shape, float32).
inline at::Tensor log_probs_from_pairs_output(const at::Tensor& values, const at::Tensor& pairs,
                                              const std::optional<at::Tensor>& temperature) {
  TORCH_CHECK_TYPE(values.scalar_type() == at::kFloat && pairs.scalar_type() == at::kFloat,
                   "log_probs_from_pairs: values and pairs must be float32, got ", values.scalar_type(), " and ",
                   pairs.scalar_type());
  TORCH_CHECK_VALUE(values.dim() == 1 || values.dim() == 2,
                    "log_probs_from_pairs: values must be [B] or [B, k], got shape ", values.sizes());
  const int64_t batch = values.size(0);
  TORCH_CHECK_VALUE(pairs.dim() == 3 && pairs.size(0) >= 1 && pairs.size(1) == batch && pairs.size(2) == 2,
                    "log_probs_from_pairs: pairs must be [tp >= 1, B=", batch, ", 2] (rank-major (ref, others)), got "
                    "shape ", pairs.sizes());
  TORCH_CHECK_VALUE(pairs.device() == values.device(), "log_probs_from_pairs: pairs must be on values' device (",
                    values.device(), "), got ", pairs.device());
  if (temperature.has_value()) {
    TORCH_CHECK_TYPE(temperature->scalar_type() == at::kFloat, "log_probs_from_pairs: temperature must be float32, "
                     "got ", temperature->scalar_type());
    TORCH_CHECK_VALUE(temperature->dim() == 1 && temperature->size(0) == batch,
                      "log_probs_from_pairs: temperature must be [B=", batch, "], got shape ", temperature->sizes());
    TORCH_CHECK_VALUE(temperature->device() == values.device(), "log_probs_from_pairs: temperature must be on "
                      "values' device (", values.device(), "), got ", temperature->device());
  }
  return at::empty(values.sizes(), values.options());
}

}  // namespace localargmax
