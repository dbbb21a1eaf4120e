// The packed (value, global index) key of DESIGN.md, "The packed key".
//
//   key = (ordered(value) << 32) | (0xFFFFFFFF - global_index)   (uint64)
//
// The maximum key over any set of entries is the torch.argmax answer over
// that set: larger value first, NaN above everything, then smaller index.
// Key 0 means "no valid entry". These helpers are shared, unchanged, by the
// CPU kernel, the CUDA kernels and the C++ unit tests.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace localargmax {

// Largest global vocabulary index a key can carry. 0xFFFFFFFF would give an
// all-zero low half, which is legal, but we keep one value of headroom so that
// "index + 1" style arithmetic on the host never wraps; DESIGN.md callers
// check `vocab_start + num_valid - 1 <= kMaxGlobalIndex`.
constexpr uint64_t kMaxGlobalIndex = 0xFFFFFFFEull;
constexpr uint64_t kNoEntryKey = 0;
constexpr uint64_t kSignFlip = 0x8000000000000000ull;
// The most keys a row keeps in top-k (shard_topk's k; the kernels' lists).
constexpr int kMaxTopk = 64;

// The bits of a float32 and back (__builtin_bit_cast: g++ and nvcc, host and
// device, no memory round trip).
LAM_HD uint32_t float_to_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
LAM_HD float bits_to_float(uint32_t u) { return __builtin_bit_cast(float, u); }

// Maps a float32 to a uint32 that sorts like the float (NaN on top, all NaNs
// equal; -0.0 equal to +0.0).
LAM_HD uint32_t ordered_bits(float x) {
  uint32_t u = float_to_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;  // any NaN
  if (u == 0x80000000u) u = 0u;                               // -0.0 -> +0.0
  return (u & 0x80000000u) ? (u ^ 0xFFFFFFFFu) : (u | 0x80000000u);
}

// Inverse of ordered_bits (NaN comes back as the canonical quiet NaN).
LAM_HD float unordered_value(uint32_t o) {
  if (o == 0xFFFFFFFFu) return bits_to_float(0x7FC00000u);
  return bits_to_float((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : (o ^ 0xFFFFFFFFu));
}

LAM_HD uint64_t pack_key(float value, uint64_t global_index) {
  return (static_cast<uint64_t>(ordered_bits(value)) << 32) |
         static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(global_index));
}

LAM_HD uint64_t key_index(uint64_t key) {
  return static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

LAM_HD float key_value(uint64_t key) {
  return unordered_value(static_cast<uint32_t>(key >> 32));
}

LAM_HD uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }

}  // namespace localargmax
