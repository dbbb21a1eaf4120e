// The planned step's two small kernels (DESIGN.md, "The planned step"):
// frame_init_kernel writes a rank's frame header and zeroes its keys before
// the fused kernel folds into them (one launch, where the plain ops memset
// their keys); merge_frames_kernel is the step's merge, one block: every row
// through common/step_merge.h's merge_row, the headers checked by every
// thread, and one validity flag for the step (__syncthreads_and), written
// without a host synchronisation.
#pragma once

#include <cstdint>

#include "../common/step_merge.h"
#include "device_runtime.cuh"

namespace localargmax {
namespace cuda {
namespace {

constexpr int kStepThreads = 256;

__global__ void __launch_bounds__(kStepThreads)
    frame_init_kernel(int64_t* __restrict__ frame, int64_t size, int64_t vocab_end, int64_t zero_words) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i == 0) {
    frame[0] = size;
    frame[1] = -size;
    frame[2] = vocab_end;
  }
  if (i < zero_words) frame[kFrameHeader + i] = 0;
}

__global__ void __launch_bounds__(kStepThreads) merge_frames_kernel(MergeFrames a, bool* __restrict__ ok) {
  int64_t vocab_total = 0, bad = 0;
  int err = check_headers(a, &vocab_total);
  uint8_t pos[kMaxMergeRanks];
  for (int64_t b = threadIdx.x; b < a.batch; b += blockDim.x) {
    if (err == kMergeSize) {
      unmerged_row(a, b);
      continue;
    }
    const int e = merge_row(a, b, vocab_total, pos, &bad);
    if (err == kMergeOk) err = e;
  }
  const int all_ok = __syncthreads_and(err == kMergeOk);
  if (threadIdx.x == 0) *ok = all_ok != 0;
}

// log_probs_from_pairs: one thread per row (common/step_merge.h's row_partition, as merge_frames_kernel).
__global__ void __launch_bounds__(kStepThreads)
    log_probs_from_pairs_kernel(const float* __restrict__ values, const float* __restrict__ pairs,
                                const float* __restrict__ temperature, int64_t tp, int64_t batch, int64_t k,
                                float* __restrict__ out) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const float t = temperature != nullptr && temperature[b] > 0.0f ? temperature[b] : 1.0f;
  const RowPartition lp = row_partition(TensorPairs{pairs, batch, b}, tp, t);
  for (int64_t j = 0; j < k; ++j) out[b * k + j] = log_prob_of(values[b * k + j], lp, t);
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
