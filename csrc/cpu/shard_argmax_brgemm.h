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

// How the brgemm path runs for weights of `dtype` on this CPU and torch
// (DESIGN.md, "CPU paths"): "amx" (cpublas::could_pack: B VNNI-packed, the
// AMX tiles), "vnni" (B VNNI-packed, oneDNN's AVX-512 ukernel, which ATen
// accepts where could_pack is false: found once per process by a tiny
// exact call), "plain" (is_vnni = false: oneDNN's float32 ukernel or ATen's
// cpublas::gemm fallback). An odd hidden size always runs "plain" (VNNI
// pairs K). localargmax._C._brgemm_mode exports it.
const char* brgemm_mode(at::ScalarType dtype);

// End of one parallel_for chunk of the brgemm path: cpublas::brgemm_release
// (the tile context is per thread).
void brgemm_end_chunk(const ShardArgmaxProblem& p);

}  // namespace cpu
}  // namespace localargmax
