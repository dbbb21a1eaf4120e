// CPU implementation of localargmax::merge_keys: unsigned max over ranks,
// decode, optional d2t lookup (target id = k + d2t[k], EAGLE-3 convention).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "../checks.h"

namespace localargmax {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> merge_keys_cpu(const at::Tensor& keys_in,
                                                  const std::optional<at::Tensor>& d2t_in) {
  check_merge_keys_args(keys_in, d2t_in);
  const at::Tensor keys = (keys_in.dim() == 1 ? keys_in.unsqueeze(0) : keys_in).contiguous();
  const int64_t tp = keys.size(0);
  const int64_t batch = keys.size(1);
  at::Tensor ids = at::empty({batch}, keys.options());
  at::Tensor values = at::empty({batch}, keys.options().dtype(at::kFloat));
  TORCH_CHECK_VALUE(tp > 0 || batch == 0, "merge_keys: keys has 0 ranks (shape ", keys_in.sizes(), ")");
  const auto* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  at::Tensor d2t;
  if (d2t_in.has_value()) d2t = d2t_in->contiguous();
  const int64_t* d2t_ptr = d2t.defined() ? d2t.data_ptr<int64_t>() : nullptr;
  const int64_t draft_vocab = d2t.defined() ? d2t.size(0) : 0;
  int64_t* id_out = ids.data_ptr<int64_t>();
  float* value_out = values.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t best = kNoEntryKey;
    for (int64_t r = 0; r < tp; ++r) best = max_key(best, k[r * batch + b]);
    TORCH_CHECK_VALUE(best != kNoEntryKey, "merge_keys: batch row ", b,
                      " has no valid vocabulary entry on any rank (all keys are 0: every shard has "
                      "num_valid == 0)");
    int64_t id = static_cast<int64_t>(key_index(best));
    if (d2t.defined()) {
      TORCH_CHECK_VALUE(id < draft_vocab, "merge_keys: winning draft id ", id,
                        " is outside d2t (length ", draft_vocab, ")");
      id += d2t_ptr[id];
    }
    id_out[b] = id;
    value_out[b] = key_value(best);
  }
  return {ids, values};
}

}  // namespace
}  // namespace cpu

TORCH_LIBRARY_IMPL(localargmax, CPU, m) { m.impl("merge_keys", &cpu::merge_keys_cpu); }

}  // namespace localargmax
