// The CPU fused "hidden x weight_shard^T -> per-row best key" kernel, on a
// range of vocabulary tiles. No torch headers here: the body
// (shard_argmax_tiles_impl.inc) is compiled four times (generic: baseline ISA;
// avx2: -mavx2 -mfma -mf16c; avx512: + -mavx512f; avx512_bf16: + -mavx512bw
// -mavx512bf16) and the caller in shard_argmax_cpu.cpp picks one at run time
// (cpu_path.h). generic, avx2 and avx512 do exactly the same float operations
// in the same order (8 independent float32 lanes per (weight row, batch row),
// one correctly rounded fused multiply-add per step, no other contraction, a
// fixed final tree; avx512 holds two weight rows' 8 lanes in one zmm), so they
// give bit-identical logits. avx512_bf16 does the same for float32 / float16
// weights; for bfloat16 weights it accumulates with vdpbf16ps (its own
// summation order, denormals flushed): other bits, the same for every
// (row, k) wherever the row sits. In every variant the per-row reduction
// order depends on k only (DESIGN.md rule 5).
#pragma once

#include <atomic>
#include <cstdint>

#include "../common/log_partition.h"

namespace localargmax {
namespace cpu {

enum class WeightDtype : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct ShardArgmaxProblem {
  const float* hidden;     // [batch, hidden_pad] float32, zero-padded to hidden_pad
  const void* weight;      // [num_valid rows used, ldw] in weight_dtype
  WeightDtype weight_dtype;
  int64_t ldw;             // elements between weight rows (any: 0 for a broadcast row)
  const float* bias;       // [num_valid] float32, or nullptr
  int64_t batch;
  int64_t hidden_size;     // H
  int64_t hidden_pad;      // H rounded up to a multiple of kLanes
  int64_t num_valid;       // rows [0, num_valid) of the shard are evaluated
  int64_t vocab_start;     // global index of local row 0
  int64_t topk;            // keys kept per batch row, sorted descending (1: argmax)
  const float* temperature;  // [batch] sampling temperatures, or nullptr (greedy);
                             // rows with temperature 0 are greedy too
  uint64_t seed;           // sampling: Philox key
  uint64_t offset;         // sampling: Philox subsequence of batch row b is offset + b
  // noise=vllm_noise(...) (common/vllm_noise.h), else nullptr: [batch] vLLM seeds and
  // positions; sampling rows then score vllm_gumbel_score with vLLM's noise.
  const int64_t* noise_seed;
  const int64_t* noise_pos;
  // Log-partition (DESIGN.md, "Log-probabilities"), or nullptr: one state per
  // (tile, batch row), [num_tiles][batch], tile = local row / kTileRows. With it
  // every logit is first transformed (transform_logit: soft-cap, then scale)
  // and the keys carry the transformed values.
  PartitionState* partition;
  // [batch] T > 0 of the log-partition's sums (shard_argmax_lse's
  // temperature: the log-odds at the request's T), or nullptr: the sampling
  // T of rows with T > 0, else 1.
  const float* partition_temperature;
  float scale;             // logit scale (> 0), with partition only
  float soft_cap;          // soft-cap c (> 0), 0 for none; with partition only
  // emit_rows folds every logit through the scalar emit (no screen, no
  // vectorised log-partition): the reference the tests compare the fast
  // epilogue with (set_scalar_epilogue; the keys and pairs are the same).
  bool scalar_epilogue;
  // avx512_bf16 with bfloat16 weights only (else nullptr): the hidden states
  // as bfloat16 (exact: hidden has the weight's dtype), [batch, hidden_pad_bf16],
  // zero-padded to hidden_pad_bf16 = H rounded up to a multiple of kBf16Pairs.
  const uint16_t* hidden_bf16;
  int64_t hidden_pad_bf16;
  // brgemm only (shard_argmax_brgemm.h), else nullptr: the B operands, the
  // hidden states transposed per block of brgemm_n batch rows (zero
  // columns past the batch), [batch_blocks][H][brgemm_n] in the
  // weight's dtype, or VNNI pairs [batch_blocks][H / 2][brgemm_n][2]
  // where brgemm_vnni; and the last partial tile's weight rows, zero-padded
  // to kTileRows x brgemm_lda.
  const void* brgemm_hidden;
  const void* brgemm_weight_tail;
  int64_t brgemm_ldk;  // K rows of one B block (H)
  int64_t brgemm_n;    // N: batch rows per call (brgemm_block_in_use)
  int64_t brgemm_m;    // M: weight rows per block, a divisor of kTileRows
  int64_t brgemm_step;  // calls per block: M / step rows each, every step-th row
  // A's leading dimension in every call: ldw, or H where ldw < H (a
  // broadcast or overlapping weight: each tile is then copied to a
  // kTileRows x H block first)
  int64_t brgemm_lda;
  bool brgemm_vnni;
  bool brgemm_recheck;  // float32: ATen re-reads the oneDNN flag per call (read it after each block)
  // Set when a block did not run on the kernel the call decided (the oneDNN
  // flag changed during the call): the call is redone without oneDNN.
  std::atomic<bool>* brgemm_refused;
};

constexpr int kLanes = 8;        // float32 lanes per accumulator
constexpr int64_t kTileRows = 64;  // vocabulary rows per parallel work item
constexpr int64_t kBf16Pairs = 32;  // bfloat16 elements per vdpbf16ps step (16 lanes x 2)
// brgemm's largest N (batch rows per call) and M (weight rows per call).
constexpr int64_t kBrgemmMaxBatchBlock = 64;

// Reduces rows [tile_begin * kTileRows, min(tile_end * kTileRows, num_valid))
// and folds each batch row's keys into best_keys[b * topk, (b + 1) * topk)
// (the topk largest, descending; key 0 = empty slot). With a temperature the
// key's value is logit / T + Gumbel noise (common/philox.h) instead of logit.
// With p.partition, also folds every entry into its tile's PartitionState, in
// ascending row order per batch row whatever the blocking, so the pairs do
// not depend on the blocking, the ISA variant or the thread count.
// scratch: at least 4 * hidden_pad floats, private to the calling thread.
void shard_argmax_tiles_avx2(const ShardArgmaxProblem& p, int64_t tile_begin,
                             int64_t tile_end, float* scratch, uint64_t* best_keys);
void shard_argmax_tiles_generic(const ShardArgmaxProblem& p, int64_t tile_begin,
                                int64_t tile_end, float* scratch, uint64_t* best_keys);
void shard_argmax_tiles_avx512(const ShardArgmaxProblem& p, int64_t tile_begin,
                               int64_t tile_end, float* scratch, uint64_t* best_keys);
void shard_argmax_tiles_avx512_bf16(const ShardArgmaxProblem& p, int64_t tile_begin,
                                    int64_t tile_end, float* scratch, uint64_t* best_keys);
// brgemm (shard_argmax_brgemm.cpp): the dot products by ATen's
// cpublas::brgemm, [brgemm_m / brgemm_step x brgemm_n] float32 per call, then emit_block
// per tile. scratch: at least kTileRows * kBrgemmMaxBatchBlock floats.
void shard_argmax_tiles_brgemm(const ShardArgmaxProblem& p, int64_t tile_begin,
                               int64_t tile_end, float* scratch, uint64_t* best_keys);

// The epilogue of every path (emit_rows, shard_argmax_tiles_impl.inc):
// folds dots[r * ld + j] (+ bias) of weight rows row0 + r, r < rows, and
// batch rows b0 + j, j < nb, into best_keys, rows ascending per batch row
// (the order the log-partition pairs need). emit_block (generic build) runs
// the AVX-512F, AVX2 or generic build of it, the widest the CPU has: the
// same keys from each (the argmax's screen only skips logits that cannot win).
void emit_block(const ShardArgmaxProblem& p, const float* dots, int64_t ld, int64_t row0, int64_t rows,
                int64_t b0, int64_t nb, uint64_t* best_keys);
typedef void (*EmitBlockFn)(const ShardArgmaxProblem&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                            uint64_t*);
void emit_block_generic(const ShardArgmaxProblem& p, const float* dots, int64_t ld, int64_t row0, int64_t rows,
                        int64_t b0, int64_t nb, uint64_t* best_keys);
void emit_block_avx2(const ShardArgmaxProblem& p, const float* dots, int64_t ld, int64_t row0, int64_t rows,
                     int64_t b0, int64_t nb, uint64_t* best_keys);
void emit_block_avx512(const ShardArgmaxProblem& p, const float* dots, int64_t ld, int64_t row0, int64_t rows,
                       int64_t b0, int64_t nb, uint64_t* best_keys);

// Tests only (localargmax._C._scalar_epilogue): true makes every CPU op's
// epilogue the scalar emit (ShardArgmaxProblem::scalar_epilogue); process-wide.
void set_scalar_epilogue(bool on);
bool scalar_epilogue();

// Float32 FLOP/s of a tight loop of independent FMAs (zmm / ymm), timed in
// the call: the core's measured FMA peak (bench/cpu_paths.py). iters: loop
// steps of 24 zmm / 12 ymm independent FMAs.
double fma_peak_avx512(int64_t iters);
double fma_peak_avx2(int64_t iters);
double dpbf16_peak(int64_t iters);  // vdpbf16ps FLOP/s (the avx512_bf16 build)

}  // namespace cpu
}  // namespace localargmax
