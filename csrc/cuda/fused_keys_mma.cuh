// The tensor-core fused shard-argmax kernels (bf16 / fp16, sm_80+): one pass
// over the weight shard with mma.sync m16n8k16 (float32 accumulators), the
// argmax (or Gumbel-max sample, or top-k) taken in the epilogue; logits never written.
// shard_launch.cuh picks one of its named configs (mma_configs.h),
// DESIGN.md ("The tensor-core kernel") says why. Weight and hidden tiles
// stream into ST shared-memory stages (cp.async, or the weight by TMA), ST - 1
// steps ahead of the tensor cores, optionally split along K between groups of
// warps inside the tile; the mma operands come from shared memory. See the
// kernel's comment below.
//
// Which k goes into which register: common/mma_fragment.h. Epilogue
// (warp_best_keys): bias, temperature and Gumbel noise as in the CUDA-core
// kernel, pack_key, max over the warp's rows by xor-shuffles, over the block's
// warps in shared memory, then one 64-bit atomicMax per batch row and block
// into keys zeroed on the same stream. Top-k (block_topk_lists): each
// block's sorted list per batch row, merged on the host as the CUDA-core
// kernel's.
//
// Requirements (checked by the launcher, which otherwise runs the CUDA-core
// kernel): hidden_size % 8 == 0, row strides % 8 == 0, 16-byte aligned data.
#pragma once

#include <cstdint>

#include "../common/mma_fragment.h"
#include "../common/packed_key.h"
#include "../common/philox.h"
#include "device_runtime.cuh"
#include "mma_configs.h"
#include "mma_sync.cuh"
#include "fused_keys_simt.cuh"

namespace localargmax {
namespace cuda {
namespace {

__device__ __forceinline__ unsigned int word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Epilogue of a warp's MT x NT tiles of float32 logits: bias, temperature and
// Gumbel noise (key_of; sampling without the log-partition through the noise
// screen, screened_sample_key, its floor per batch column the max of keys[b]
// and of the 8 lanes' sample_key_floor), then for each n-tile nt in turn emit(nt, j, state)
// with the best key over the warp's rows for batch row b0 + 8 nt + 2t + j
// (state.best_key), the same in every lane with that thread-in-group t
// (xor-shuffles over the 8 lanes of each t); one n-tile's states live at a
// time. Rows past num_valid and batch rows past batch never count. With lse
// (uniform over the launch; a constant false in the TMA configs, which then
// have no log-partition code) the logits are transformed first (transform_logit) and the state also carries
// the warp's log-partition (ref, others) of that batch row: each lane folds
// its rows in ascending order (m-tile, then row g before g + 8), then the 8
// lanes of the group merge by the xor butterfly (offsets 4, 8, 16): the tree
// ((g0 g1)(g2 g3))((g4 g5)(g6 g7)), lane g = 0's state emitted (the same
// bits in all 8 lanes: a merge of two states commutes where their best keys
// differ; DESIGN.md, "Log-probabilities").
template <typename T, int MT, int NT, typename Emit>
__device__ __forceinline__ void warp_best_keys(const float (&acc)[MT][NT][4], int row_base, int64_t b0, int64_t batch,
                                               int num_valid, const T* __restrict__ bias_t,
                                               const float* __restrict__ bias_f, int64_t vocab_start,
                                               const ShardReduce& out, bool lse, Emit&& emit) {
  const int lane = threadIdx.x % 32;
  const bool has_bias = bias_f != nullptr || bias_t != nullptr;
  float bias[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = row_base + 16 * mt + mma_c_row(lane, r);
      bias[mt][r] = 0.0f;
      if (row < num_valid && bias_f != nullptr) bias[mt][r] = bias_f[row];
      if (row < num_valid && bias_t != nullptr) bias[mt][r] = to_float(bias_t[row]);
    }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    PartitionState best[2] = {partition_init(), partition_init()};
    float t_sum[2] = {1.0f, 1.0f};  // lse: the sums' temperature of batch column j
    if (lse) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t b = b0 + 8 * nt + mma_c_col(lane, j);
        if (b < batch) t_sum[j] = partition_temperature(b, out);
      }
    }
    // Sampling without the log-partition: the noise screen. Its floor per
    // batch column j: keys[b] and the 8 lanes' sample_key_floor (each
    // logit's noise estimate kept for the keys). Not in the configs of more
    // than 16 tiles a warp (kMmaRoomyWarpTiles); they key every logit.
    constexpr bool kScreen = MT * NT <= kMmaRoomyWarpTiles;
    const bool screen = kScreen && !lse && out.temperature != nullptr;
    unsigned long long floor[2] = {kNoEntryKey, kNoEntryKey};
    float t_noise[2] = {0.0f, 0.0f};
    float noise[kScreen ? MT : 1][4];
    if (screen) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t b = b0 + 8 * nt + mma_c_col(lane, j);
        if (b < batch) {
          floor[j] = key_so_far(out.keys, b);
          t_noise[j] = noise_temperature(b, out);
        }
      }
#pragma unroll
      for (int mt = 0; mt < (kScreen ? MT : 0); ++mt) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = row_base + 16 * mt + mma_c_row(lane, r);
          const int64_t b = b0 + 8 * nt + mma_c_col(lane, r);
          noise[mt][r] = 0.0f;
          if (row >= num_valid || b >= batch || t_noise[r % 2] == 0.0f) continue;
          const float s = has_bias ? __fadd_rn(acc[mt][nt][r], bias[mt][r]) : acc[mt][nt][r];
          const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(row);
          noise[mt][r] = noise_estimate(b, global_index, out);
          floor[r % 2] = max_key(floor[r % 2], sample_key_floor(s, t_noise[r % 2], noise[mt][r], global_index));
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int offset = 4; offset < 32; offset *= 2)
          floor[j] = max_key(floor[j], __shfl_xor_sync(0xFFFFFFFFu, floor[j], offset));
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = row_base + 16 * mt + mma_c_row(lane, r);
        const int64_t b = b0 + 8 * nt + mma_c_col(lane, r);
        if (row >= num_valid || b >= batch) continue;
        float s = acc[mt][nt][r];
        if (has_bias) s = __fadd_rn(s, bias[mt][r]);
        if (lse) s = transform_logit(s, out.scale, out.soft_cap);
        const uint64_t global_index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(row);
        unsigned long long key;
        if constexpr (kScreen) {
          key = screen && t_noise[r % 2] > 0.0f
                    ? screened_sample_key(s, t_noise[r % 2], noise[mt][r], b, global_index, out,
                                          max_key(floor[r % 2], best[r % 2].best_key))
                    : key_of(s, b, global_index, out);
        } else {
          key = key_of(s, b, global_index, out);
        }
        if (lse) {
          partition_add(best[r % 2], s, key, t_sum[r % 2]);
        } else if (key > best[r % 2].best_key) {
          best[r % 2].best_key = key;
        }
      }
    }
    // Over the 8 lanes of each thread-in-group t (lanes t, t+4, ..., t+28).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) {
        const unsigned long long other_key = __shfl_xor_sync(0xFFFFFFFFu, best[j].best_key, offset);
        if (lse) {  // (partition_merge commutes where the keys differ: lane 0's is emitted)
          const PartitionState other{other_key, __shfl_xor_sync(0xFFFFFFFFu, best[j].ref, offset),
                                     __shfl_xor_sync(0xFFFFFFFFu, best[j].others, offset)};
          partition_merge(best[j], other, t_sum[j]);
        } else {
          best[j].best_key = max_key(best[j].best_key, other_key);
        }
      }
      emit(nt, j, best[j]);
    }
  }
}

// Top-k (out.block_topk): the topk best keys of the block's kRows weight rows
// per batch row of the pass, sorted descending, to out.block_topk[blockIdx.x][b]
// (slots past the block's valid rows key 0), warp column by warp column: the
// warps of split-K group 0 in column c key all their live n-tiles' logits
// (bias, with lse the transform: the keys argmax would fold; top-k draws no
// noise, so a key is its value's ordered bits over the row's index) into
// cand[r][j] = the key's high word (weight row r of the block, batch row j
// of the column: kRows x 8 NT words), a barrier, then thread j < 8 NT selects
// batch row j's list by topk scans over the block's valid rows (the largest
// key below the one found before: keys are distinct, so the list is exact
// and sorted), a barrier. Each warp's sums die with its column's keys (the
// selection holds a few registers; an insertion list held all 16 n-tiles'
// sums across the log-partition's epilogue and spilled). `scratch`: the
// stages (every split-K partial read before the first barrier here).
template <typename T, int MT, int NT, int WM, int WN>
__device__ __forceinline__ void block_topk_lists(const float (&sum)[MT][NT][4], bool mine, int wm, int wn,
                                                 int tile_row0, int64_t b0, int64_t batch, int live_rows,
                                                 int num_valid, const T* __restrict__ bias_t,
                                                 const float* __restrict__ bias_f, int64_t vocab_start,
                                                 const ShardReduce& out, bool lse, void* scratch) {
  constexpr int kRows = WM * MT * 16;
  constexpr int kColumnRows = 8 * NT;  // batch rows of a warp column
  using Candidates = uint32_t[kRows][kColumnRows];
  Candidates& cand = *static_cast<Candidates*>(scratch);
  const int lane = threadIdx.x % 32;
  const int rows = min(kRows, num_valid - tile_row0);  // the block's valid rows
  __syncthreads();  // (the split-K partials read: the stages are free)
#pragma unroll  // (rolled, n16_r64_w2's top-k spilled 1 KiB on sm_100 at 255 registers; unrolled 196, no spill)
  for (int c = 0; c < WN; ++c) {
    if (kColumnRows * c >= live_rows) break;  // (block-uniform: no batch row in this column or past it)
    if (mine && wn == c) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (8 * (NT * wn + nt) >= live_rows) break;  // (warp-uniform)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int local = wm * MT * 16 + 16 * mt + mma_c_row(lane, r);
            const int j = 8 * nt + mma_c_col(lane, r);
            const int64_t b = b0 + kColumnRows * wn + j;
            if (local >= rows || b >= batch) continue;
            float s = sum[mt][nt][r];
            if (bias_f != nullptr) s = __fadd_rn(s, bias_f[tile_row0 + local]);
            if (bias_t != nullptr) s = __fadd_rn(s, to_float(bias_t[tile_row0 + local]));
            if (lse) s = transform_logit(s, out.scale, out.soft_cap);
            const uint64_t index = static_cast<uint64_t>(vocab_start) + static_cast<uint64_t>(tile_row0 + local);
            cand[local][j] = static_cast<uint32_t>(key_of(s, b, index, out) >> 32);
          }
      }
    }
    __syncthreads();
    const int j = threadIdx.x;
    const int64_t b = b0 + kColumnRows * c + j;
    if (j < kColumnRows && b < batch) {
      unsigned long long* dst = out.block_topk + (static_cast<int64_t>(blockIdx.x) * batch + b) * out.topk;
      const uint32_t low0 = 0xFFFFFFFFu - static_cast<uint32_t>(vocab_start + tile_row0);  // row 0's low word
      // bound: the list's last key so far (exclusive; the first scan has none:
      // a NaN logit at global index 0 keys ~0)
      unsigned long long bound = ~0ull;
      for (int k = 0; k < out.topk; ++k) {
        unsigned long long best = kNoEntryKey;
        for (int r = 0; r < rows; ++r) {
          const unsigned long long key = (static_cast<unsigned long long>(cand[r][j]) << 32) | (low0 - r);
          if ((k == 0 || key < bound) && key > best) best = key;
        }
        dst[k] = best;
        bound = best;
      }
    }
    __syncthreads();
  }
}

// The pipelined tensor-core kernel. A block owns kRows = WM * MT * 16 weight
// rows (WM warps along the rows, each MT m-tiles of 16) and kBatchRows =
// 8 * NT * WN batch rows per pass (WN warps along the batch, NT n-tiles each,
// all multiplying the same weight stage: one read of the weight per pass;
// more batch rows: blockIdx.y, grid-stride). K goes in 32-element
// chunks; a pipeline step moves KC consecutive chunks of the weight tile and
// of the hidden tile into one of ST shared-memory stages with cp.async
// (16 bytes per thread and copy, zero-filled past the row and k tails), ST - 1
// steps ahead of the tensor cores; the mma operands come from shared memory
// in the register layout of common/mma_fragment.h (16 contiguous bytes per
// lane and row: conflict-free, no ldmatrix needed).
//
// Split-K: the block has SK groups of WM * WN warps; group ks multiplies chunk
// slots c = a * SK + ks (a < KC / SK) of every step into its accumulator set
// a. Chunk slot c of every step is one partial sum p_c (chunks c, c + KC,
// c + 2 KC, ... in increasing k); the logit is (((p_0 + p_1) + p_2) ...) in
// float32, added by group 0, the other groups' partials passed through shared
// memory. The order depends on KC only, not on SK, WM, ST, the row's place or
// the batch row's place (DESIGN.md rule 5): variants with the same KC and NT
// give the same bits, so the launcher may choose among them by grid size.
//
// Per step: wait for the step's group (cp.async.wait_group ST - 2), a block
// barrier (the stage visible to every thread; every thread done with the
// stage refilled next), issue step + ST - 1 into the stage freed by step - 1,
// commit (an empty group past the end keeps the count), multiply. The
// prologue issues the weight of steps 0 .. ST - 2 before
// griddepcontrol.wait (programmatic dependent launch: with the launch
// attribute the weight streams while the previous kernel finishes) and the
// hidden rows after it, one group per step.
//
// TMA (sm_90+; the launcher never runs it below): the weight of a step is KC
// bulk tensor copies (cp.async.bulk.tensor.2d, one box of 32 k-elements x
// kRows rows of weight_map per chunk slot: no swizzle, so the box lands in
// exactly the stages[st][c] layout; rows past num_valid and k past
// hidden_size are zero-filled by the tensor map's bounds), issued by thread
// 0, completing on the stage's mbarrier (weight_full[st], after the stages;
// arrive.expect_tx of the KC boxes' bytes, zero-filled ones included). Every
// thread waits for the stage's phase before the step's barrier; the hidden
// rows stay on cp.async (the batch-row predicate). Same sums as the cp.async
// twin: the copy mechanism changes, not the data or the order. weight_map is
// unused (zeros) without TMA.
//
// TOPK (the top-k kernel, shard_topk_mma_pipe_kernel; cp.async configs of at
// most kMmaRoomyWarpTiles tiles a warp): block_topk_lists instead of the
// argmax fold, the log-partition's states (with out.block_partition) after
// it. Its own kernel: with top-k as a run-time branch the argmax kernels of
// 16 n-tiles a warp, at their 128-register cap, spilled.
template <typename T, int NT, int MT, int WM, int WN, int SK, int KC, int ST, bool TMA, bool TOPK>
__device__ __forceinline__ void mma_pipe(const T* __restrict__ hidden, int64_t ldh, const T* __restrict__ weight,
                                         int64_t ldw, const T* __restrict__ bias_t, const float* __restrict__ bias_f,
                                         int64_t batch, int hidden_size, int num_valid, int64_t vocab_start,
                                         const ShardReduce& out, const WeightTensorMap& weight_map) {
  constexpr int kThreads = WM * WN * SK * 32;
  constexpr int kRows = WM * MT * 16;          // weight rows of the tile
  constexpr int kBatchRows = 8 * NT * WN;      // batch rows of a pass
  constexpr int kTileRows = kRows + kBatchRows;  // + hidden rows
  constexpr int kAcc = KC / SK;                // accumulator sets per warp
  static_assert(KC % SK == 0 && ST >= 2 && kBatchRows <= kThreads, "pipeline shape");
  static_assert(SK == 1 || KC * WM * WN * MT * NT * 4 * 32 * 4 <= ST * KC * kTileRows * 64,
                "split-K partials fit in the stages");
  static_assert(!TMA || (kRows <= 256 && ST <= 32), "TMA: a box dimension is at most 256; one parity bit per stage");
  // The split-K partials' bytes at the start of the stages (read in the
  // epilogue) and, after them, the log-partition's per-warp states
  // [WM][kBatchRows] (written in the epilogue, merged by store_block_partition).
  constexpr int kPartialBytes = SK > 1 ? KC * WM * WN * MT * NT * 4 * 32 * 4 : 0;
  // The log-partition runs on the cp.async configs, when the launch passes
  // out.block_partition (the *_lse ops): one build per config carries both.
  constexpr bool kLse = !TMA;
  const bool lse = kLse && out.block_partition != nullptr;
  static_assert(kPartialBytes + (kLse ? WM * kBatchRows * 16 : 0) <= ST * KC * kTileRows * 64,
                "split-K partials and the log-partition states fit in the stages");
  // Top-k (block_topk_lists): its candidates in the stages after the k-loop.
  constexpr bool topk = TOPK;
  static_assert(!TOPK || (!TMA && MT * NT <= kMmaRoomyWarpTiles), "top-k: the cp.async configs with room for it");
  static_assert(!TOPK || kRows * 8 * NT * 4 <= ST * KC * kTileRows * 64, "top-k's candidates fit in the stages");
  // stages[st][c][r][q]: 16 bytes (k = 32 * chunk + 8 q ..) of tile row r
  // (weight rows, then hidden rows) of chunk slot c of the step in stage st,
  // in the block's dynamic shared memory: the launch passes
  // MmaConfig::dynamic_smem() (mma_configs.h; 128-byte aligned, as a bulk
  // tensor copy's destination must be: every stage and chunk slot is
  // kTileRows * 64 bytes, kTileRows even; past the 48 KiB static limit for the
  // 256-row and deep variants).
  using Stage = uint4[KC][kTileRows][4];
  Stage* const stages = reinterpret_cast<Stage*>(dynamic_shared_memory());
  // TMA: the mbarrier of each stage's weight (after the stages) and, bit st,
  // the parity of the phase of stage st that the next wait waits for.
  unsigned long long* const weight_full = reinterpret_cast<unsigned long long*>(stages + ST);
  unsigned int weight_parity = 0;
  __shared__ unsigned long long block_best[WM][kBatchRows];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wm = warp % WM;
  const int wn = warp / WM % WN;  // this warp's batch rows of the pass: 8 NT wn ..
  const int ks = warp / (WM * WN);
  const int tile_row0 = static_cast<int>(blockIdx.x) * kRows;
  const int row_base = tile_row0 + wm * MT * 16;
  const int num_steps = (hidden_size + KC * kMmaChunkK - 1) / (KC * kMmaChunkK);
  const int64_t num_batch_chunks = (batch + kBatchRows - 1) / kBatchRows;
  if constexpr (TMA) {
    if (threadIdx.x == 0) {
      // (shared addresses keep their offset's low bits in the generic window)
      if (reinterpret_cast<uintptr_t>(stages) % 128 != 0) __trap();  // a box copy's destination: 128-byte aligned
      for (int st = 0; st < ST; ++st) mbarrier_init(&weight_full[st], 1);  // one arrival: thread 0's expect_tx
      mbarrier_init_fence();  // the inits visible to the async proxy (the copies' complete_tx)
    }
    __syncthreads();  // ... and to every thread
  }

  for (int64_t chunk = blockIdx.y; chunk < num_batch_chunks; chunk += gridDim.y) {
    const int64_t b0 = chunk * kBatchRows;
    // The pass's n-tiles that hold a batch row: only they are loaded and
    // multiplied (an n-tile past the batch would add nothing but work).
    const int64_t rows_left = (batch - b0 + 7) / 8 * 8;
    const int live_rows = rows_left < kBatchRows ? static_cast<int>(rows_left) : kBatchRows;
    // Step `step` into stage `st`: the weight rows (cp.async, or TMA) / the hidden rows (cp.async).
    const auto load_weight = [&](int st, int step) {
      if constexpr (TMA) {
        if (threadIdx.x == 0) {
          // Every earlier generic-proxy access of the stage (the mma operand
          // reads of step - 1, the split-K partials and epilogue of the previous
          // batch chunk) is ordered before this thread by the last barrier; the
          // proxy fence orders them before the async proxy's writes (PTX ISA,
          // Memory Consistency Model, "Proxy-preserved base causality order": a
          // proxy fence on the causality path between accesses through
          // different proxies).
          fence_proxy_async_shared();
          mbarrier_arrive_expect_tx(&weight_full[st], KC * kRows * 64);
          for (int c = 0; c < KC; ++c)
            tma_load_2d(&stages[st][c][0][0], &weight_map, (step * KC + c) * kMmaChunkK, tile_row0, &weight_full[st]);
        }
      } else {
#pragma unroll 1
        for (int i = threadIdx.x; i < KC * kRows * 4; i += kThreads) {
          const int c = i / (kRows * 4), r = i / 4 % kRows, q = i % 4;
          const int k = (step * KC + c) * kMmaChunkK + 8 * q;
          const int row = tile_row0 + r;
          const bool ok = k < hidden_size && row < num_valid;
          cp_async16(&stages[st][c][r][q], weight + (ok ? static_cast<int64_t>(row) * ldw + k : 0), ok);
        }
      }
    };
    const auto load_hidden = [&](int st, int step) {
#pragma unroll 1
      for (int i = threadIdx.x; i < KC * kBatchRows * 4; i += kThreads) {
        const int c = i / (kBatchRows * 4), r = i / 4 % kBatchRows, q = i % 4;
        if (r >= live_rows) continue;
        const int k = (step * KC + c) * kMmaChunkK + 8 * q;
        const int64_t b = b0 + r;
        const bool ok = k < hidden_size && b < batch;
        cp_async16(&stages[st][c][kRows + r][q], hidden + (ok ? b * ldh + k : 0), ok);
      }
    };
#pragma unroll
    for (int st = 0; st < ST - 1; ++st)
      if (st < num_steps) load_weight(st, st);
    grid_dependency_wait();
#pragma unroll
    for (int st = 0; st < ST - 1; ++st) {
      if (st < num_steps) load_hidden(st, st);
      cp_async_commit();
    }

    float acc[kAcc][MT][NT][4] = {};

    for (int step = 0; step < num_steps; ++step) {
      if constexpr (TMA) {  // the step's weight: its stage's phase complete (and its bytes visible to this thread)
        mbarrier_wait_parity(&weight_full[step % ST], (weight_parity >> (step % ST)) & 1u);
        weight_parity ^= 1u << (step % ST);
      }
      cp_async_wait<ST - 2>();
      __syncthreads();
      const int next = step + ST - 1;
      if (next < num_steps) {
        load_weight(next % ST, next);
        load_hidden(next % ST, next);
      }
      cp_async_commit();
      const int st = step % ST;
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        const int c = a * SK + ks;
        uint4 w[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) w[mt][h] = stages[st][c][wm * MT * 16 + 16 * mt + 8 * h + g][t];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (8 * (NT * wn + nt) >= live_rows) break;  // (warp-uniform)
          const uint4 hv = stages[st][c][kRows + 8 * (NT * wn + nt) + g][t];
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma_16816<T>(acc[a][mt][nt], word_of(w[mt][mma_a_row_half(0)], mma_a_word(s, 0)),
                           word_of(w[mt][mma_a_row_half(1)], mma_a_word(s, 1)),
                           word_of(w[mt][mma_a_row_half(2)], mma_a_word(s, 2)),
                           word_of(w[mt][mma_a_row_half(3)], mma_a_word(s, 3)), word_of(hv, mma_b_word(s, 0)),
                           word_of(hv, mma_b_word(s, 1)));
        }
      }
    }
    cp_async_wait<0>();
    allow_dependent_launch();
    // (TMA: every copy issued, step < num_steps, was waited for by every thread
    // in the loop: none is in flight when the stages take the partials)
    __syncthreads();  // every stage read: free for the partials and the next batch chunk

    // logit = ((p_0 + p_1) + ...) + p_{KC-1}; p_c sits in group c % SK, set c / SK.
    float* part = reinterpret_cast<float*>(&stages[0][0][0][0]);
    using WarpStates = PartitionState[WM][kBatchRows];
    const auto warp_states = [&]() -> WarpStates& {
      return *reinterpret_cast<WarpStates*>(reinterpret_cast<char*>(stages) + kPartialBytes);
    };
    const auto part_at = [&](int c, int mt, int nt, int r) -> float& {
      return part[(((((c * WN + wn) * WM + wm) * MT + mt) * NT + nt) * 4 + r) * 32 + lane];
    };
    if (SK > 1) {
      if (ks != 0) {
#pragma unroll
        for (int a = 0; a < kAcc; ++a)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int r = 0; r < 4; ++r) part_at(a * SK + ks, mt, nt, r) = acc[a][mt][nt][r];
      }
      __syncthreads();
    }
    float sum[MT][NT][4];  // (split-K group 0's)
    if (ks == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            sum[mt][nt][r] = acc[0][mt][nt][r];
#pragma unroll
            for (int c = 1; c < KC; ++c)
              sum[mt][nt][r] =
                  __fadd_rn(sum[mt][nt][r], c % SK == 0 ? acc[c / SK][mt][nt][r] : part_at(c, mt, nt, r));
          }
    }
    // Top-k first (its selection holds few registers beside the sums), then
    // with the log-partition the states from the same sums (their stages
    // region is free again when block_topk_lists returns).
    if constexpr (TOPK)
      block_topk_lists<T, MT, NT, WM, WN>(sum, ks == 0, wm, wn, tile_row0, b0, batch, live_rows, num_valid, bias_t,
                                          bias_f, vocab_start, out, lse, stages);
    if (ks == 0 && (!topk || lse))  // (top-k: the states only)
      warp_best_keys<T, MT, NT>(sum, row_base, b0 + 8 * NT * wn, batch, num_valid, bias_t, bias_f, vocab_start, out,
                                lse, [&](int nt, int j, const PartitionState& state) {
                                  if (g != 0) return;
                                  block_best[wm][8 * (NT * wn + nt) + 2 * t + j] = state.best_key;
                                  if (lse) warp_states()[wm][8 * (NT * wn + nt) + 2 * t + j] = state;
                                });
    __syncthreads();
    // (block_best is written again only after the next batch chunk's barriers)
    if (!topk) fold_block_best(block_best, b0, batch, out.keys);
    // The warps' states merged in warp order into the block's (barriers
    // around it: the stages are refilled by the next batch chunk after it).
    if (lse) store_block_partition(warp_states(), b0, batch, out);
  }
}

// The kernels (mma_pipe's two builds): argmax / sample, and top-k.
template <typename T, int NT, int MT, int WM, int WN, int SK, int KC, int ST, int MINB, bool TMA = false>
__global__ void __launch_bounds__(WM * WN * SK * 32, MINB)
    shard_argmax_mma_pipe_kernel(const T* __restrict__ hidden, int64_t ldh, const T* __restrict__ weight, int64_t ldw,
                                 const T* __restrict__ bias_t, const float* __restrict__ bias_f, int64_t batch,
                                 int hidden_size, int num_valid, int64_t vocab_start, ShardReduce out,
                                 const __grid_constant__ WeightTensorMap weight_map) {
  mma_pipe<T, NT, MT, WM, WN, SK, KC, ST, TMA, false>(hidden, ldh, weight, ldw, bias_t, bias_f, batch, hidden_size,
                                                      num_valid, vocab_start, out, weight_map);
}
template <typename T, int NT, int MT, int WM, int WN, int SK, int KC, int ST, int MINB>
__global__ void __launch_bounds__(WM * WN * SK * 32, MINB)
    shard_topk_mma_pipe_kernel(const T* __restrict__ hidden, int64_t ldh, const T* __restrict__ weight, int64_t ldw,
                               const T* __restrict__ bias_t, const float* __restrict__ bias_f, int64_t batch,
                               int hidden_size, int num_valid, int64_t vocab_start, ShardReduce out,
                               const __grid_constant__ WeightTensorMap weight_map) {
  mma_pipe<T, NT, MT, WM, WN, SK, KC, ST, false, true>(hidden, ldh, weight, ldw, bias_t, bias_f, batch, hidden_size,
                                                       num_valid, vocab_start, out, weight_map);
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
