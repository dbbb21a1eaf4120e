// The per-row log-partition pair of DESIGN.md, "Log-probabilities": what each
// rank adds to its keys so that the step can turn the merged winner's logit
// into a log-probability, and the argmax into its log-odds, over the full
// unpadded vocabulary.
//
//   ref    = x of the shard's best key (its transformed logit; -inf if the shard is empty)
//   others = sum over the shard's valid entries v other than the best of exp((x_v - ref) / t)
//
// with x_v = transform_logit(logit_v) and t the row's temperature (1 unless
// the op was given one). The best entry's own term (1, or 0 for x == -inf) is
// left out, so a confident row keeps its small sum exactly (sum - 1 would
// cancel it). Conventions that keep the sums finite and match float64
// log_softmax: an entry with x == -inf adds 0, an entry with x == ref adds
// exactly 1 (also for +inf), NaN anywhere makes the sum NaN. Shared,
// unchanged, by the CPU kernel, the CUDA kernels and the host emulation.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace localargmax {

// The logits' transform before the softmax, in vLLM's order: soft-cap
// tanh(x / c) * c when c > 0 (c == 0: none), then the scale (x * 1 is exact).
LAM_HD float transform_logit(float x, float scale, float soft_cap) {
  if (soft_cap > 0.0f) x = tanhf(x / soft_cap) * soft_cap;
  return x * scale;
}

// exp((x - ref) / t) with the pair's conventions (x == -inf: 0, x == ref: 1).
LAM_HD float partition_term(float x, float ref, float t) {
  if (x == -INFINITY) return 0.0f;
  if (x == ref) return 1.0f;
  return expf((x - ref) / t);
}

// One shard's (or part of a shard's) running pair, with the key its ref
// belongs to: the reference moves with the best key; when it does, the old
// best joins `others` and the sum is rescaled (the online softmax's
// rescaling, with the best key's x instead of the maximum; for argmax /
// top-k they are the same).
struct PartitionState {
  uint64_t best_key;  // 0: no entry yet
  float ref;
  float others;
};

LAM_HD PartitionState partition_init() { return PartitionState{0, -INFINITY, 0.0f}; }

// Folds entry (x, key) in: key is the entry's packed key (its value is x, or
// x's Gumbel score when sampling), t > 0. A new best: the old best (term 1,
// or 0 if there was none or it was -inf) joins the others, rescaled to x. (A
// NaN best that came first leaves others 0: partition_others makes it NaN.)
LAM_HD void partition_add(PartitionState& s, float x, uint64_t key, float t) {
  if (key > s.best_key) {
    s.others = (s.others + 1.0f) * partition_term(s.ref, x, t);
    s.ref = x;
    s.best_key = key;
  } else {
    s.others = s.others + partition_term(x, s.ref, t);
  }
}

// Folds a whole partial state in: the loser's best entry joins the others
// with its own. Commutes bit for bit when the best keys differ (merge(a, b)
// and merge(b, a) differ only in the order of one addition; equal keys are
// two states of no valid key); partial states must still be grouped in a
// fixed order (it does not associate).
LAM_HD void partition_merge(PartitionState& a, const PartitionState& b, float t) {
  if (b.best_key > a.best_key) {
    a.others = (a.others + 1.0f) * partition_term(a.ref, b.ref, t) + b.others;
    a.ref = b.ref;
    a.best_key = b.best_key;
  } else {
    a.others = a.others + (b.others + 1.0f) * partition_term(b.ref, a.ref, t);
  }
}

// The pair's `others` of a whole shard's state: NaN when its best is NaN
// (the states' rescaling can leave 0 there: exp((-inf - NaN) / t) is taken as 0).
LAM_HD float partition_others(const PartitionState& s) { return s.ref != s.ref ? s.ref : s.others; }

}  // namespace localargmax
