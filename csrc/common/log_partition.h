// The per-row log-partition pair of DESIGN.md, "Log-probabilities": what each
// rank adds to its keys so that the step can turn the merged winner's logit
// into a log-probability over the full unpadded vocabulary.
//
//   ref = x of the shard's best key (its transformed logit; -inf if the shard is empty)
//   sum = sum over the shard's valid entries v of exp((x_v - ref) / t)
//
// with x_v = transform_logit(logit_v) and t the row's temperature (1 for
// argmax / top-k and greedy sampling rows). Conventions that keep the sums
// finite and match float64 log_softmax: an entry with x == -inf adds 0, an
// entry with x == ref adds exactly 1 (also for +inf), NaN anywhere makes the
// sum NaN. Shared, unchanged, by the CPU kernel, the CUDA kernels and the host
// emulation.
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
// belongs to: the reference moves with the best key, and the sum is rescaled
// when it does (the online softmax's rescaling, with the best key's x instead
// of the maximum; for argmax / top-k they are the same).
struct PartitionState {
  uint64_t best_key;  // 0: no entry yet
  float ref;
  float sum;
};

LAM_HD PartitionState partition_init() { return PartitionState{0, -INFINITY, 0.0f}; }

// Folds entry (x, key) in: key is the entry's packed key (its value is x, or
// x's Gumbel score when sampling), t > 0.
LAM_HD void partition_add(PartitionState& s, float x, uint64_t key, float t) {
  if (key > s.best_key) {
    s.sum = s.sum * partition_term(s.ref, x, t);
    s.ref = x;
    s.best_key = key;
  }
  s.sum = s.sum + partition_term(x, s.ref, t);
}

// Folds a whole partial state in (b after a, in that order).
LAM_HD void partition_merge(PartitionState& a, const PartitionState& b, float t) {
  if (b.best_key > a.best_key) {
    a.sum = a.sum * partition_term(a.ref, b.ref, t) + b.sum;
    a.ref = b.ref;
    a.best_key = b.best_key;
  } else {
    a.sum = a.sum + b.sum * partition_term(b.ref, a.ref, t);
  }
}

}  // namespace localargmax
