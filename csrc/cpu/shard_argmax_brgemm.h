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

// Fills p.brgemm_* for hidden [batch, H] and weight [rows, H] (one dtype)
// with rows [0, num_valid) used. ValueError if this torch has no brgemm.
BrgemmOperands prepare_brgemm(const at::Tensor& hidden, const at::Tensor& weight, int64_t num_valid,
                              ShardArgmaxProblem& p);

// Whether the brgemm path packs B and runs on the matrix engine for weights
// of `dtype` (cpublas::could_pack: AMX / AMX-FP16 with oneDNN enabled; false
// for float32 and without brgemm). localargmax._C._brgemm_packs exports it.
bool brgemm_packs(at::ScalarType dtype);

// End of one parallel_for chunk of the brgemm path: cpublas::brgemm_release
// (the tile context is per thread).
void brgemm_end_chunk(const ShardArgmaxProblem& p);

}  // namespace cpu
}  // namespace localargmax
