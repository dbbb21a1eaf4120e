// vLLM 0.34's Gumbel noise (noise=vllm_noise(...); DESIGN.md, "vLLM's noise"), shared by
// the CPU and CUDA kernels, the host emulation and the CPU op
// localargmax::vllm_gumbel_noise. Transcribed from
// vllm/v1/worker/gpu/sample/gumbel.py (vLLM 0.34):
//
//   murmur3_hash32(seed, pos, id, domain): h = domain, then MurmurHash3's
//     block mix of the words (seed lo, seed hi, pos lo, uint32(id)), then
//     fmix32(h ^ 16) (the length: four 4-byte words);
//   murmur3_uniform32: the hash r as two 16-bit halves,
//     u = float(r >> 16) * 2^-16 + (float(r & 0xFFFF) + 0.5) * 2^-32 in float32
//     (both products exact: one rounding, the correctly rounded (r + 0.5) * 2^-32);
//   _log1p_neg_stable(u): log(1 - u), a degree-8 series in Horner form below
//     u = 0.25, log(max(1 - u, 2^-24)) above;
//   g = -log(-_log1p_neg_stable(u)), float32; the score is fl(x / T) + g.
//
// Every operation is an IEEE float32 operation in vLLM's order (the build has
// -ffp-contract=off and nvcc -fmad=false, so nothing is fused) except the two
// logs: logf of the platform (glibc on the host, CUDA's logf on the device),
// which, like Triton's tl.log, is not correctly rounded; DESIGN.md says where
// the bits can therefore differ from vLLM's.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "packed_key.h"

namespace localargmax {

// The second hash's domain of murmur3_uniform64.
constexpr uint32_t kVllmUniform64Domain = 0x9E3779B9u;

LAM_HD uint32_t vllm_rotl32(uint32_t v, int s) { return (v << s) | (v >> (32 - s)); }

LAM_HD uint32_t vllm_murmur3_mix(uint32_t h, uint32_t key) {
  key *= 0xCC9E2D51u;
  key = vllm_rotl32(key, 15);
  key *= 0x1B873593u;
  h ^= key;
  h = vllm_rotl32(h, 13);
  return h * 5u + 0xE6546B64u;
}

LAM_HD uint32_t vllm_murmur3_fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// vLLM's murmur3_hash32(seed, pos, offset, domain): seed int64 (both halves),
// pos int64 (its low 32 bits only), id as uint32.
LAM_HD uint32_t vllm_murmur3_hash32(uint64_t seed, uint64_t pos, uint64_t id, uint32_t domain = 0u) {
  uint32_t h = domain;
  h = vllm_murmur3_mix(h, static_cast<uint32_t>(seed));
  h = vllm_murmur3_mix(h, static_cast<uint32_t>(seed >> 32));
  h = vllm_murmur3_mix(h, static_cast<uint32_t>(pos));
  h = vllm_murmur3_mix(h, static_cast<uint32_t>(id));
  return vllm_murmur3_fmix32(h ^ 16u);
}

// vLLM's murmur3_uniform32: in (0, 1), float32.
LAM_HD float vllm_uniform32(uint32_t r) {
  const float hi = static_cast<float>(static_cast<int32_t>(r >> 16));
  const float lo = static_cast<float>(static_cast<int32_t>(r & 0xFFFFu));
  return hi * 1.52587890625e-05f + (lo + 0.5f) * 2.3283064365386963e-10f;
}

// vLLM's _log1p_neg_stable(u) = log(1 - u), float32: Horner steps unfused, the
// coefficients Python's 1.0 / n rounded to float32 (as Triton makes them).
LAM_HD float vllm_log1p_neg(float u) {
  if (u < 0.25f) {
    float p = static_cast<float>(1.0 / 8.0);
    p = static_cast<float>(1.0 / 7.0) + u * p;
    p = static_cast<float>(1.0 / 6.0) + u * p;
    p = static_cast<float>(1.0 / 5.0) + u * p;
    p = static_cast<float>(1.0 / 4.0) + u * p;
    p = static_cast<float>(1.0 / 3.0) + u * p;
    p = static_cast<float>(1.0 / 2.0) + u * p;
    p = 1.0f + u * p;
    return -u * p;
  }
  const float one_minus = 1.0f - u;
  return logf(one_minus > 5.960464477539063e-08f ? one_minus : 5.960464477539063e-08f);
}

// vLLM's float32 Gumbel noise at (seed, pos, global id); pos already salted
// (+ 2**30, vLLM's _DRAFT_NOISE_SALT: localargmax.vllm_noise adds it) when
// drafting, seed already mixed with the speculative
// step (seed ^ (step << 32)) where vLLM does.
LAM_HD float vllm_gumbel_noise(uint64_t seed, uint64_t pos, uint64_t id) {
  return -logf(-vllm_log1p_neg(vllm_uniform32(vllm_murmur3_hash32(seed, pos, id))));
}

// vLLM's use_fp64_gumbel noise: murmur3_uniform64 (53 bits from two hashes,
// the second in domain 0x9E3779B9), g = -log(-log(u)) in float64.
LAM_HD double vllm_gumbel_noise64(uint64_t seed, uint64_t pos, uint64_t id) {
  const uint64_t lo = vllm_murmur3_hash32(seed, pos, id);
  const uint64_t hi = vllm_murmur3_hash32(seed, pos, id, kVllmUniform64Domain);
  const uint64_t r53 = ((hi << 32) | lo) >> 11;
  double u = (static_cast<double>(r53) + 0.5) * 1.1102230246251565e-16;
  if (u == 1.0) u -= 1.1102230246251565e-16;
  return -log(-log(u));
}

// The Gumbel-max score of vLLM's gumbel_noised_argmax at T > 0: the logit
// divided by T (the same division as vLLM's _temperature_kernel), plus g, in
// float32. Unlike gumbel_score (philox.h) it can overflow for tiny T, as
// vLLM's does: then the row's finite logits all score +-inf and tie.
LAM_HD float vllm_gumbel_score(float s, float t, float g) { return s / t + g; }

// The packed key of a score under vLLM's noise, greedy rows (T == 0) included: vLLM's Sampler
// (gumbel_sample's per-block tl.max and its combine) drops NaN and draws among the other logits, so
// a NaN score takes -inf's key here: it never beats another entry, and a row of NaN alone gets its
// smallest id. (Without vLLM's noise NaN wins, DESIGN.md rule 2, as vLLM's get_top_tokens.)
LAM_HD uint64_t vllm_score_key(float score, uint64_t global_index) {
  return pack_key(score != score ? -INFINITY : score, global_index);
}

}  // namespace localargmax
