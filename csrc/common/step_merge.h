// The step's merge (DESIGN.md, "The planned step"): one function per row that
// the CPU op and the CUDA kernel (cuda/merge_frames_kernel.cuh) both run, so a
// step's ids, values, log-probabilities and log-odds are the same bits on
// every device. It reads every rank's frame
//
//   [size, -size, vocab_end, key_0 … key_{n-1}, pair_0 … pair_{B-1}]      (DESIGN.md, "The step's exchange")
//
// checks the headers, takes the winner (argmax, sample) or the k largest keys
// (top-k) over the ranks, decodes, applies d2t and computes the
// log-probabilities / log-odds from the ranks' pairs, in float32, ranks in
// order 0, 1, … (the formulas of DESIGN.md, "Log-probabilities" and
// "Log-odds"). Nothing here allocates or synchronises: a failed check is an
// error code, which the CPU op raises as ValueError and the CUDA kernel folds
// into the step's one validity flag.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "packed_key.h"

namespace localargmax {

constexpr int64_t kFrameHeader = 3;               // int64 words before the keys
constexpr int64_t kPairsFlag = int64_t{1} << 40;  // added to the size word when pairs follow
constexpr int64_t kMaxMergeRanks = 256;           // top-k merge: one uint8 cursor per rank

enum StepMode : int { kStepArgmax = 0, kStepTopk = 1, kStepSample = 2 };

// What went wrong, first found first (the order of the checks in DESIGN.md).
enum MergeError : int {
  kMergeOk = 0,
  kMergeSize = 1,        // a rank sent another number of keys, or pairs where this rank did not
  kMergeRange = 2,       // a key decodes to an id >= vocab_total
  kMergeD2tLength = 3,   // d2t's length is not vocab_total
  kMergeNoEntry = 4,     // a row has no valid entry on any rank (argmax, sample)
  kMergeTopkShort = 5,   // fewer than k valid entries over all ranks (top-k)
  kMergeD2tTarget = 6,   // k + d2t[k] outside the target vocabulary [0, target_vocab)
};

struct MergeFrames {
  const uint64_t* frames;  // [tp, stride] words (rank-major)
  int64_t tp, stride;
  int64_t batch, k;        // keys per rank: batch * k
  bool pairs;              // one pair word per row after the keys
  bool flipped;            // every word XOR kSignFlip (the frames of an all-reduce MAX)
  int mode;                // StepMode
  bool has_d2t;
  const int64_t* d2t;      // [d2t_len] (has_d2t)
  int64_t d2t_len;
  int64_t target_vocab;    // > 0: mapped ids must lie in [0, target_vocab)
  const float* temperature;  // [batch] or nullptr: the log-probabilities' / log-odds' T (T > 0, else 1)
  int64_t* ids;            // [batch * k]
  float* values;           // [batch * k]
  float* log_probs;        // [batch * k] or nullptr
  float* log_odds;         // [batch] or nullptr
};

LAM_HD uint64_t frame_word(const MergeFrames& a, int64_t rank, int64_t i) {
  const uint64_t w = a.frames[rank * a.stride + i];
  return a.flipped ? w ^ kSignFlip : w;
}

LAM_HD int64_t frame_size(const MergeFrames& a) { return a.batch * a.k + 1 + (a.pairs ? kPairsFlag : 0); }

// Every rank's header: the size words, then vocab_total = max vocab_end, then d2t's length.
LAM_HD int check_headers(const MergeFrames& a, int64_t* vocab_total) {
  const int64_t size = frame_size(a);
  int64_t total = 0;
  int err = kMergeOk;
  for (int64_t r = 0; r < a.tp; ++r) {
    const int64_t s = static_cast<int64_t>(frame_word(a, r, 0));
    const int64_t neg = static_cast<int64_t>(frame_word(a, r, 1));
    const int64_t end = static_cast<int64_t>(frame_word(a, r, 2));
    if (s != size || neg != -size) err = kMergeSize;
    total = end > total ? end : total;
  }
  *vocab_total = total;
  if (err == kMergeOk && a.has_d2t && a.d2t_len != total) err = kMergeD2tLength;
  return err;
}

// Row b's key of rank r, slot j.
LAM_HD uint64_t row_key(const MergeFrames& a, int64_t r, int64_t b, int64_t j) {
  return frame_word(a, r, kFrameHeader + b * a.k + j);
}

LAM_HD float pair_ref(const MergeFrames& a, int64_t r, int64_t b) {
  return bits_to_float(static_cast<uint32_t>(frame_word(a, r, kFrameHeader + a.batch * a.k + b)));
}

LAM_HD float pair_others(const MergeFrames& a, int64_t r, int64_t b) {
  return bits_to_float(static_cast<uint32_t>(frame_word(a, r, kFrameHeader + a.batch * a.k + b) >> 32));
}

// IEEE single operations, never contracted (the CPU build has -ffp-contract=off, CUDA -fmad=false).
LAM_HD bool finite_float(float x) { return x - x == 0.0f; }
LAM_HD float merge_exp(float x) { return expf(x); }
LAM_HD float merge_log(float x) { return logf(x); }

// Row b's pairs in the ranks' frames (free functions, never members: LAM_HD is static per translation unit).
struct FramePairs {
  const MergeFrames& a;
  int64_t b;
};
LAM_HD float ref_of(const FramePairs& p, int64_t r) { return pair_ref(p.a, r, p.b); }
LAM_HD float others_of(const FramePairs& p, int64_t r) { return pair_others(p.a, r, p.b); }

// Row b's pairs in a [tp, batch, 2] float32 tensor.
struct TensorPairs {
  const float* pairs;
  int64_t batch, b;
};
LAM_HD float ref_of(const TensorPairs& p, int64_t r) { return p.pairs[(r * p.batch + p.b) * 2]; }
LAM_HD float others_of(const TensorPairs& p, int64_t r) { return p.pairs[(r * p.batch + p.b) * 2 + 1]; }

// A row's log-partition over the ranks' (ref, others) pairs (DESIGN.md, "Log-probabilities"): A = max_r ref_r
// (NaN anywhere: NaN) and log S, S = sum_r (others_r + [ref_r > -inf]) * (ref_r == A ? 1 : exp((ref_r - A) / t)),
// ranks in order 0, 1, ... Pairs: ref_of(p, r), others_of(p, r). The step's merge and the op
// localargmax::log_probs_from_pairs both call it: a log-probability is the same bits whichever computes it.
struct RowPartition {
  float top, log_total;
};

template <class Pairs>
LAM_HD RowPartition row_partition(const Pairs& p, int64_t tp, float t) {
  float top = -INFINITY, total = 0.0f;
  for (int64_t r = 0; r < tp; ++r) {
    const float ref = ref_of(p, r);
    top = (ref != ref || top != top) ? NAN : (ref > top ? ref : top);
  }
  for (int64_t r = 0; r < tp; ++r) {
    const float ref = ref_of(p, r);
    const float own = others_of(p, r) + (ref > -INFINITY ? 1.0f : 0.0f);
    total = total + own * (ref == top ? 1.0f : merge_exp((ref - top) / t));
  }
  return {top, merge_log(total)};
}

// The log-probability of the transformed logit x: (x - A) / t - log S.
LAM_HD float log_prob_of(float x, const RowPartition& lp, float t) { return (x - lp.top) / t - lp.log_total; }

// The row's rank whose key wins (the first of equal keys: the smallest rank).
LAM_HD int64_t winning_rank_of(const MergeFrames& a, int64_t b) {
  uint64_t best = row_key(a, 0, b, 0);
  int64_t w = 0;
  for (int64_t r = 1; r < a.tp; ++r) {
    const uint64_t key = row_key(a, r, b, 0);
    if (key > best) best = key, w = r;
  }
  return w;
}

// Row b when the headers disagree on the layout: no id, every output written (NaN).
LAM_HD void unmerged_row(const MergeFrames& a, int64_t b) {
  for (int64_t j = 0; j < a.k; ++j) {
    a.ids[b * a.k + j] = -1, a.values[b * a.k + j] = NAN;
    if (a.log_probs != nullptr) a.log_probs[b * a.k + j] = NAN;
  }
  if (a.log_odds != nullptr) a.log_odds[b] = NAN;
}

// Merges row b into the outputs; returns a MergeError (and in *bad the id it concerns).
// pos: kMaxMergeRanks bytes of scratch (top-k only).
LAM_HD int merge_row(const MergeFrames& a, int64_t b, int64_t vocab_total, uint8_t* pos, int64_t* bad) {
  int err = kMergeOk;
  // every key of the row decodes inside the vocabulary (a corrupt exchange yields no id past it)
  for (int64_t r = 0; r < a.tp; ++r)
    for (int64_t j = 0; j < a.k; ++j) {
      const uint64_t key = row_key(a, r, b, j);
      if (key != kNoEntryKey && static_cast<int64_t>(key_index(key)) >= vocab_total && err == kMergeOk) {
        err = kMergeRange;
        *bad = static_cast<int64_t>(key_index(key));
      }
    }
  for (int64_t r = 0; r < a.tp && a.mode == kStepTopk; ++r) pos[r] = 0;
  const float t = a.temperature != nullptr && a.temperature[b] > 0.0f ? a.temperature[b] : 1.0f;
  const RowPartition lp = a.log_probs != nullptr ? row_partition(FramePairs{a, b}, a.tp, t) : RowPartition{0.0f, 0.0f};
  const int64_t winner = a.mode == kStepTopk ? 0 : winning_rank_of(a, b);
  for (int64_t j = 0; j < a.k; ++j) {
    uint64_t best = kNoEntryKey;
    if (a.mode == kStepTopk) {
      int64_t from = -1;
      for (int64_t r = 0; r < a.tp; ++r) {
        if (pos[r] >= a.k) continue;
        const uint64_t key = row_key(a, r, b, pos[r]);
        if (from < 0 || key > best) best = key, from = r;
      }
      pos[from] += 1;
    } else {
      best = row_key(a, winner, b, 0);
    }
    const int64_t slot = b * a.k + j;
    int64_t id = static_cast<int64_t>(key_index(best));
    if (best == kNoEntryKey) {
      if (err == kMergeOk) err = a.mode == kStepTopk ? kMergeTopkShort : kMergeNoEntry;
      id = -1;
    } else if (a.has_d2t) {
      if (id < a.d2t_len) {
        const int64_t mapped = id + a.d2t[id];
        if (mapped < 0 || (a.target_vocab > 0 && mapped >= a.target_vocab)) {
          if (err == kMergeOk) err = kMergeD2tTarget, *bad = id;
          id = -1;
        } else {
          id = mapped;
        }
      } else {
        id = -1;  // a draft id past d2t: the length check (kMergeD2tLength) has failed already
      }
    }
    a.ids[slot] = id;
    const float value = best == kNoEntryKey ? NAN : key_value(best);
    a.values[slot] = value;
    if (a.log_probs != nullptr) {
      // the sampled entry's x is the winning rank's ref (its key carries the noised score)
      const float x = a.mode == kStepSample ? pair_ref(a, winner, b) : value;
      a.log_probs[slot] = log_prob_of(x, lp, t);
    }
  }
  if (a.log_odds != nullptr) {
    // the winning rank adds its others; every other rank its others + [ref > -inf], times exp((ref - top) / t)
    const float wtop = pair_ref(a, winner, b);
    float sum = 0.0f;
    for (int64_t r = 0; r < a.tp; ++r) {
      const float ref = pair_ref(a, r, b);
      const float own = pair_others(a, r, b) + (ref > -INFINITY && r != winner ? 1.0f : 0.0f);
      sum = sum + own * (ref == wtop ? 1.0f : merge_exp((ref - wtop) / t));
    }
    const bool t_finite = a.temperature == nullptr || finite_float(a.temperature[b]);
    a.log_odds[b] = finite_float(wtop) && t_finite ? -merge_log(sum) : NAN;
  }
  return err;
}

}  // namespace localargmax
