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

#if !defined(__CUDA_ARCH__)
// exp(x) in float32 from IEEE +, -, * and exact bit steps only (Cody-Waite
// reduction by ln 2 in two parts, Cephes' degree-6 polynomial, the scale
// 2^n in two exact-or-once-rounded multiplies: subnormal results round once),
// within 1 ulp of exp. F is float (I int32_t) or a GCC vector of floats (I
// the int32 vector of its width): every lane takes the same operations as the
// scalar form, so the CPU kernels' vectorised log-partition (emit_rows) gives
// the bits of the scalar one. The build has -ffp-contract=off: nothing fuses.
// The host's partition_term, so every host pair uses it.
inline int32_t expf_to_int(float n) { return static_cast<int32_t>(n); }
inline float expf_from_bits(int32_t b) { return __builtin_bit_cast(float, b); }
template <typename I, typename F>
inline I expf_to_int(F n) { return __builtin_convertvector(n, I); }
template <typename F, typename I>
inline F expf_from_bits(I b) { return reinterpret_cast<F>(b); }

template <typename F, typename I>
inline F ieee_expf(F x) {
  const F lo = F{} + -104.0f, hi = F{} + 89.0f;                 // exp(-104) rounds to 0, exp(89) to inf
  x = x < lo ? lo : x;                                          // NaN stays NaN
  x = x > hi ? hi : x;
  const F magic = F{} + 12582912.0f;                            // 1.5 * 2^23: t + magic - magic rounds t to an integer
  F n = (x * 1.44269504088896341f + magic) - magic;              // round(x / ln 2), |n| <= 150
  n = n == n ? n : F{};                                         // NaN: any n (the polynomial keeps the NaN)
  const F r = (x - n * 0.693359375f) - n * -2.12194440e-4f;     // x - n ln 2; n * 0.693359375 is exact
  F y = F{} + 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = (y * (r * r) + r) + 1.0f;
  I k;
  if constexpr (sizeof(F) == sizeof(float)) k = expf_to_int(n);
  else k = expf_to_int<I>(n);
  const I k1 = k >> 1, k2 = k - k1;                             // 2^k = 2^k1 * 2^k2, each a normal float
  if constexpr (sizeof(F) == sizeof(float))
    return y * expf_from_bits((k1 + 127) << 23) * expf_from_bits((k2 + 127) << 23);
  else
    return y * expf_from_bits<F>((k1 + 127) << 23) * expf_from_bits<F>((k2 + 127) << 23);
}
#endif

// exp((x - ref) / t) with the pair's conventions (x == -inf: 0, x == ref: 1):
// CUDA's expf on the device, ieee_expf on the host.
LAM_HD float partition_term(float x, float ref, float t) {
  if (x == -INFINITY) return 0.0f;
  if (x == ref) return 1.0f;
#if defined(__CUDA_ARCH__)
  return expf((x - ref) / t);
#else
  return ieee_expf<float, int32_t>((x - ref) / t);
#endif
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
