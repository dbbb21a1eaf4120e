// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11; the generator behind torch's CUDA RNG and cuRAND's
// curand_init(seed, subsequence, offset)) and the Gumbel noise of the
// tp-invariant sampler. Shared by the CPU and CUDA kernels.
//
// Noise for (seed, row, global vocab index v): Philox with
//   key     = (seed lo, seed hi)
//   counter = (v lo, v hi, row lo, row hi)
// i.e. cuRAND's subsequence = row, 128-bit block = v; the first output word
// x gives u = (x + 0.5) / 2^32 in (0, 1), and g = -log(-log(u)) (in double,
// then converted to float: the double logs' absolute error, about 2^-52, is
// below half a float ulp wherever |g| >= 2^-27 or so; nearer 0 (u near 1/e)
// the float is that double's rounding, not the exact value's). The noise is
// the same bits in every kernel (one function). It depends on the global index only, never on the
// shard, so the sampled token is the same for every TP layout.
#pragma once

#include <cmath>
#include <cstdint>

#include "packed_key.h"

namespace localargmax {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

LAM_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox 4x32 on ctr with key (k0, k1); the result replaces ctr.
LAM_HD void philox4x32_10(uint32_t (&ctr)[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kPhiloxM0, ctr[0], hi0, lo0);
    mulhilo32(kPhiloxM1, ctr[2], hi1, lo1);
    const uint32_t c0 = hi1 ^ ctr[1] ^ k0;
    const uint32_t c1 = lo1;
    const uint32_t c2 = hi0 ^ ctr[3] ^ k1;
    const uint32_t c3 = lo0;
    ctr[0] = c0;
    ctr[1] = c1;
    ctr[2] = c2;
    ctr[3] = c3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The noise of Philox's first output word x: u = (x + 0.5) / 2^32,
// -log(-log(u)) in double, converted to float (see above near g = 0).
// Nondecreasing in x up to the double logs' last-bit error (far below a float ulp).
LAM_HD float gumbel_of_word(uint32_t x) {
  const double u = (static_cast<double>(x) + 0.5) * (1.0 / 4294967296.0);
  return static_cast<float>(-log(-log(u)));
}

// Philox's first output word for (seed, row, global vocabulary index).
LAM_HD uint32_t gumbel_word(uint64_t seed, uint64_t row, uint64_t index) {
  uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(row), static_cast<uint32_t>(row >> 32)};
  philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return ctr[0];
}

// Standard Gumbel noise for (seed, row, global vocabulary index).
LAM_HD float gumbel_noise(uint64_t seed, uint64_t row, uint64_t index) {
  return gumbel_of_word(gumbel_word(seed, row, index));
}

// The noise screen's bounds (DESIGN.md, "The noise screen"), in float
// arithmetic, no double logs: gumbel_estimate(x) is within
// gumbel_slack(gumbel_estimate(x)) of gumbel_of_word(x). -log(u) comes from
// logf of u where u <= 1/2 and from log1pf of -(1 - u) above (1 - u =
// (~x + 0.5) / 2^32 is exact before its float rounding), so it carries a
// relative error of a few float ulps; -logf of it then an absolute error of
// a few ulps of max(1, |g|), under 2^-18 in all. The slack, 2^-12 (1 + |g|),
// is 64 times that (tests/test_emulation_screen.py checks the bounds on 2^22
// words and the extremes).
LAM_HD float gumbel_estimate(uint32_t x) {
  const float a = x < 0x80000000u ? -logf((static_cast<float>(x) + 0.5f) * 0x1p-32f)
                                  : -log1pf(-(static_cast<float>(~x) + 0.5f) * 0x1p-32f);
  return -logf(a);
}
LAM_HD float gumbel_slack(float g) { return 0x1p-12f * (1.0f + fabsf(g)); }

// A temperature the samplers accept: finite and >= 0 (0 = greedy). NaN, a
// negative or an infinite T has no distribution behind it (T = inf would give
// -inf / inf = NaN for a banned token, and NaN wins the argmax).
LAM_HD bool valid_temperature(float t) { return t >= 0.0f && t <= 3.40282347e38f; }

// The Gumbel-max score of logit s at temperature t > 0 with noise g: its
// argmax over the vocabulary is a sample of softmax(logits / t). Computed as
// s / t + g for t >= 1 and as t * (s / t + g) = s + t * g for t < 1, so that
// neither form can overflow (s / t did for tiny t: every logit became +-inf,
// the row tied and the smallest index won). Multiplying a row's scores by
// t > 0 keeps their order, so both forms sample the same distribution; as
// t -> 0+ the noise term vanishes and the score is the logit itself (greedy,
// ties to the smallest index). One function for every CPU and CUDA kernel:
// the same float operations, so the sample is the same on every rank.
LAM_HD float gumbel_score(float s, float t, float g) { return t >= 1.0f ? s / t + g : s + t * g; }

}  // namespace localargmax
