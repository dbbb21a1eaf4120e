// The brgemm CPU path's operands (shard_argmax_brgemm.cpp): ATen's
// at::native::cpublas::brgemm for the dot products, our epilogue
// (emit_block) for the keys. DESIGN.md, "CPU paths".
#pragma once

#include <ATen/ATen.h>

#include "shard_argmax_tiles.h"

namespace localargmax {
namespace cpu {

// The tensors the brgemm path's ShardArgmaxProblem fields point into (keep
// them alive for the call).
struct BrgemmOperands {
  at::Tensor hidden_blocks;  // p.brgemm_hidden
  at::Tensor weight_tail;    // p.brgemm_weight_tail (undefined: no partial tile)
};

// Whether this call runs the brgemm path for weights of `dtype`: always for
// bf16 / fp16; float32 only where torch.backends.mkldnn.enabled reads true
// and not `flag_free` (ATen serves a float32 brgemm by oneDNN or by its gemm
// fallback as the flag says at each call: without oneDNN the call runs
// auto's float32 path instead, DESIGN.md "CPU paths").
bool brgemm_serves(at::ScalarType dtype, bool flag_free);

// Fills p.brgemm_* for hidden [batch, H] and weight [rows, H] (one dtype)
// with rows [0, num_valid) used, reading the oneDNN flag once (brgemm_mode)
// unless `flag_free` (bf16 / fp16: the plain B, which ATen serves without
// reading it). ValueError if this torch has no brgemm.
BrgemmOperands prepare_brgemm(const at::Tensor& hidden, const at::Tensor& weight, int64_t num_valid,
                              ShardArgmaxProblem& p, bool flag_free);

// How the brgemm path runs for weights of `dtype` on this CPU and torch
// (DESIGN.md, "CPU paths"): "amx" (cpublas::could_pack: B VNNI-packed, the
// AMX tiles), "vnni" (B VNNI-packed, oneDNN's AVX-512 ukernel, which ATen
// accepts where could_pack is false: found by a tiny exact call, remembered
// once oneDNN has answered), "plain" (is_vnni = false: oneDNN's float32
// ukernel or ATen's cpublas::gemm fallback). An odd hidden size always runs
// "plain" (VNNI pairs K). localargmax._C._brgemm_mode exports it.
const char* brgemm_mode(at::ScalarType dtype);

// The brgemm calls of a block: m weight rows (a divisor of kTileRows) by n
// batch rows (the B operand's columns, zero past the batch), taken as `step`
// calls of m / step rows each, every step-th row of the m (lda = step row
// strides, ldc = step n; C lands in row order).
struct BrgemmBlock {
  int64_t m, n, step;
};
// The block a call of `batch` rows of `hidden_size` takes (DESIGN.md, "CPU
// paths"): on AMX (brgemm_mode "amx") where H <= 1024 64 weight rows by
// 16 batch rows up to 16, 32 up to 32 and 64 past, in calls of every 2nd row
// up to 32 batch rows and every 4th past; above H 1024 32 x 16 up to 16 batch
// rows, else 16 x 32 up to 32 and 16 x 64 past (measured on an AMX Xeon);
// elsewhere 64 x 16 up to 16 batch rows, else 64 x 32 (measured fastest on
// the EPYC); step 1 unless said. Every block gives a (row, batch row) the
// same bits (tests/test_cpu_brgemm.py).
BrgemmBlock brgemm_block(int64_t batch, int64_t hidden_size, bool amx);
// brgemm_block, or the block set_brgemm_block forced.
BrgemmBlock brgemm_block_in_use(int64_t batch, int64_t hidden_size, bool amx);
// Tests only (localargmax._C._brgemm_block(batch, hidden_size, amx, force)): forces every
// brgemm call's block to m x n in `step` calls (m, n 16, 32 or 64; step 1, 2
// or 4 with m / step >= 16; 0, 0, 1: the rule again); process-wide.
// ValueError for any other m, n, step.
void set_brgemm_block(int64_t m, int64_t n, int64_t step);

// Tests only (localargmax._C._brgemm_calls()): the cpublas::brgemm calls the
// path made since the last reading (process-wide, every thread); reading
// starts the count again.
int64_t brgemm_calls();

// Benchmark only (bench/cpu_paths.py --epilogue-share, through
// localargmax._C._brgemm_epilogue): false makes the brgemm path skip
// emit_block, so a call times the tiles alone and its keys are all empty.
// Process-wide; true (the default) everywhere else.
void set_brgemm_epilogue(bool on);
bool brgemm_epilogue();

// Ends one parallel_for chunk of the brgemm path when it leaves scope, on
// unwind too: cpublas::brgemm_release where the chunk ran a VNNI B (the tile
// context and ATen's current kernel are per thread; a chunk that skipped it
// left ATen believing its tiles configured after another kernel released
// them: SIGILL at the next tile instruction).
class BrgemmChunk {
 public:
  explicit BrgemmChunk(bool vnni) : vnni_(vnni) {}
  BrgemmChunk(const BrgemmChunk&) = delete;
  BrgemmChunk& operator=(const BrgemmChunk&) = delete;
  ~BrgemmChunk();

 private:
  bool vnni_;
};

}  // namespace cpu
}  // namespace localargmax
