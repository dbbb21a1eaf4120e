// The merge_keys kernel (launched by merge_keys_cuda.cu): one thread per batch
// row: unsigned max over ranks, decode, optional d2t lookup. A row with no
// valid entry (all keys 0), or a draft id outside d2t, gets id -1 and value
// NaN (no host sync to raise).
#pragma once

#include <cstdint>

#include "../common/packed_key.h"
#include "device_runtime.cuh"

namespace localargmax {
namespace cuda {
namespace {

constexpr int kMergeThreads = 256;

__global__ void __launch_bounds__(kMergeThreads)
    merge_keys_kernel(const unsigned long long* __restrict__ keys, int64_t tp, int64_t batch, bool has_d2t,
                      const int64_t* __restrict__ d2t, int64_t draft_vocab, int64_t* __restrict__ ids,
                      float* __restrict__ values) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  unsigned long long best = kNoEntryKey;
  for (int64_t r = 0; r < tp; ++r) best = max_key(best, keys[r * batch + b]);
  const int64_t id = static_cast<int64_t>(key_index(best));
  if (best == kNoEntryKey || (has_d2t && id >= draft_vocab)) {
    ids[b] = -1;
    values[b] = __uint_as_float(0x7FC00000u);
    return;
  }
  ids[b] = has_d2t ? id + d2t[id] : id;
  values[b] = key_value(best);
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
