// CPU implementation of localargmax::merge_frames, the step's merge
// (common/step_merge.h, one function per row for CPU and CUDA alike). With
// raise_errors (the host path: CPU tensors, eager) a failed check raises
// ValueError naming what the ranks disagree on; otherwise it only clears the
// returned validity flag, as the CUDA kernel does (the device path, which the
// step folds into one torch._assert_async).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../common/step_merge.h"
#include "../merge_frames.h"

namespace localargmax {
namespace cpu {
namespace {

std::string sizes_message(const MergeFrames& a) {
  const int64_t n = a.batch * a.k;
  std::vector<int64_t> sizes, negs;
  bool with_pairs = false, without_pairs = false;
  for (int64_t r = 0; r < a.tp; ++r) {
    sizes.push_back(static_cast<int64_t>(frame_word(a, r, 0)));
    negs.push_back(-static_cast<int64_t>(frame_word(a, r, 1)));
    for (const int64_t s : {sizes.back(), negs.back()}) (s >= kPairsFlag ? with_pairs : without_pairs) = true;
  }
  std::ostringstream m;
  if (with_pairs && without_pairs) {
    m << "the TP ranks disagree on whether this step exchanges log-partition pairs: every rank must be called "
         "with the same return_log_probs and return_log_odds (this rank sent pairs: "
      << (a.pairs ? "True" : "False") << ")";
    return m.str();
  }
  m << "the TP ranks disagree on the size of this step's key exchange: this rank sent " << n << " keys (shape ("
    << a.batch << (a.mode == kStepTopk ? ", " + std::to_string(a.k) + ")" : ",)") << "), the ranks sent ";
  if (!a.flipped) {
    m << "[";
    for (int64_t r = 0; r < a.tp; ++r) m << (r ? ", " : "") << (sizes[r] - 1) % kPairsFlag;
    m << "]";
  } else {
    m << "between " << (negs[0] - 1) % kPairsFlag << " and " << (sizes[0] - 1) % kPairsFlag;
  }
  m << "; every rank must be called with the same batch size (and k). LOCALARGMAX_DEBUG=1 checks this before "
       "the collective and names the ranks.";
  return m.str();
}

void raise_merge_error(int err, const MergeFrames& a, int64_t vocab_total, int64_t row, int64_t bad) {
  switch (err) {
    case kMergeSize: TORCH_CHECK_VALUE(false, sizes_message(a));
    case kMergeRange:
      TORCH_CHECK_VALUE(false, "a received key decodes to vocabulary id ", bad, ", outside the valid vocabulary [0, ",
                        vocab_total, ") of the TP ranks: the key exchange was corrupted (ranks out of step?)");
    case kMergeD2tLength:
      TORCH_CHECK_VALUE(false, "d2t has ", a.d2t_len, " entries but the draft vocabulary of the TP ranks has ",
                        vocab_total, " ids [0, ", vocab_total, "): d2t must be 1-D [draft_vocab_size=", vocab_total,
                        "], one entry per draft id, as localargmax.validate_d2t requires (DESIGN.md, \"d2t\")");
    case kMergeNoEntry:
      TORCH_CHECK_VALUE(false, "merge_keys: batch row ", row,
                        " has no valid vocabulary entry on any rank (all keys are 0: every shard has num_valid == 0)");
    case kMergeTopkShort:
      TORCH_CHECK_VALUE(false, "k=", a.k, " exceeds the valid vocabulary summed over all ranks");
    case kMergeD2tTarget: {
      const int64_t mapped = bad + a.d2t[bad];
      std::ostringstream range;
      if (a.target_vocab > 0)
        range << "[0, " << a.target_vocab << ")";
      else
        range << "[0, inf)";
      TORCH_CHECK_VALUE(false, "d2t maps draft id ", bad, " to target id ", mapped, " (", bad, " + d2t[", bad,
                        "] = ", bad, " + ", a.d2t[bad], "), outside the target vocabulary ", range.str(),
                        ": d2t must map every draft id into the target vocabulary (localargmax.validate_d2t)");
    }
    default: break;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_frames_cpu(
    const at::Tensor& frames_in, int64_t batch, int64_t k, bool pairs, int64_t mode,
    const std::optional<at::Tensor>& d2t_in, int64_t target_vocab, const std::optional<at::Tensor>& temperature_in,
    bool log_probs, bool log_odds, bool sign_flipped, bool raise_errors) {
  MergeOutputs out = merge_frames_outputs(frames_in, batch, k, pairs, mode, d2t_in, temperature_in, log_probs,
                                          log_odds, sign_flipped);
  const at::Tensor frames = frames_2d(frames_in, batch, k, pairs);
  const at::Tensor d2t = d2t_in.has_value() ? d2t_in->contiguous() : at::Tensor();
  const at::Tensor temperature = temperature_in.has_value() ? temperature_in->contiguous() : at::Tensor();
  MergeFrames a = merge_frames_args(frames, batch, k, pairs, mode, d2t, target_vocab, temperature, sign_flipped, out);
  int64_t vocab_total = 0, row = 0, bad = 0;
  int err = check_headers(a, &vocab_total);
  std::vector<uint8_t> pos(static_cast<size_t>(a.tp));
  for (int64_t b = 0; b < batch; ++b) {
    if (err == kMergeSize) {  // no row can be read as this rank's layout
      unmerged_row(a, b);
    } else {
      int64_t row_bad = 0;
      const int e = merge_row(a, b, vocab_total, pos.data(), &row_bad);
      // the first failed check in DESIGN.md's order: range before d2t's length before the rows' own
      if (e != kMergeOk && (err == kMergeOk || (e == kMergeRange && err != kMergeRange))) err = e, row = b, bad = row_bad;
    }
  }
  if (raise_errors) raise_merge_error(err, a, vocab_total, row, bad);
  out.ok.fill_(err == kMergeOk);
  return {out.ids, out.values, out.log_probs, out.log_odds, out.ok};
}

// localargmax::log_probs_from_pairs on the CPU: row_partition and log_prob_of (common/step_merge.h), the
// step's merge's own arithmetic.
at::Tensor log_probs_from_pairs_cpu(const at::Tensor& values_in, const at::Tensor& pairs_in,
                                    const std::optional<at::Tensor>& temperature_in) {
  at::Tensor out = log_probs_from_pairs_output(values_in, pairs_in, temperature_in);
  const at::Tensor values = values_in.contiguous(), pairs = pairs_in.contiguous();
  const at::Tensor temperature = temperature_in.has_value() ? temperature_in->contiguous() : at::Tensor();
  const int64_t batch = values.size(0), k = values.dim() == 2 ? values.size(1) : 1, tp = pairs.size(0);
  const float* v = values.data_ptr<float>();
  const float* t = temperature.defined() ? temperature.data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b) {
    const float tb = t != nullptr && t[b] > 0.0f ? t[b] : 1.0f;
    const RowPartition lp = row_partition(TensorPairs{pairs.data_ptr<float>(), batch, b}, tp, tb);
    for (int64_t j = 0; j < k; ++j) o[b * k + j] = log_prob_of(v[b * k + j], lp, tb);
  }
  return out;
}

TORCH_LIBRARY_IMPL(localargmax, CPU, m) {
  m.impl("merge_frames", &merge_frames_cpu);
  m.impl("log_probs_from_pairs", &log_probs_from_pairs_cpu);
}

}  // namespace cpu
}  // namespace localargmax
