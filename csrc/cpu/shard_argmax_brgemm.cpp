// The brgemm CPU path (see shard_argmax_brgemm.h): per vocabulary tile, one
// cpublas::brgemm call of M = kTileRows weight rows (the A operand read in
// place, lda = the weight's row stride) by N = kBrgemmBatchBlock batch rows
// (the B operand: hidden states transposed once per call, zero columns past
// the batch) over K = H, float32 C; then emit_block, every path's epilogue.
// M, N, K, lda, ldb and ldc are the same in every call of one problem (the
// last partial tile is copied to a zero-padded kTileRows x ldw block), so
// every (row, batch row) runs the same oneDNN kernel wherever it sits.
// Where cpublas::could_pack(dtype) (AMX, AMX-FP16) B is VNNI-packed by
// cpublas::pack and brgemm runs on the tiles; elsewhere brgemm runs with
// is_vnni = false, which ATen serves as it can (DESIGN.md, "CPU paths").
#include "shard_argmax_brgemm.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#if defined(CPUBLAS_BRGEMM_F32F32F32) && defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
#define LAM_HAVE_BRGEMM 1
#else
#define LAM_HAVE_BRGEMM 0
#endif

namespace localargmax {
namespace cpu {

#if LAM_HAVE_BRGEMM
namespace blas = at::native::cpublas;

namespace {

// C[kTileRows, kBrgemmBatchBlock] = A[kTileRows, H] (rows lda apart) x B block.
void brgemm_block(const ShardArgmaxProblem& p, const void* a, const void* b, float* c) {
  const int64_t M = kTileRows, N = kBrgemmBatchBlock, K = p.hidden_size;
  switch (p.weight_dtype) {
    case WeightDtype::kBFloat16:
      blas::brgemm(M, N, K, p.ldw, N, N, false, static_cast<const at::BFloat16*>(a),
                   static_cast<const at::BFloat16*>(b), c, p.brgemm_vnni);
      break;
    case WeightDtype::kFloat16:
      blas::brgemm(M, N, K, p.ldw, N, N, false, static_cast<const at::Half*>(a), static_cast<const at::Half*>(b), c,
                   p.brgemm_vnni);
      break;
    default:
      blas::brgemm(M, N, K, p.ldw, N, N, false, static_cast<const float*>(a), static_cast<const float*>(b), c, false);
  }
}

size_t element_size(WeightDtype dtype) { return dtype == WeightDtype::kFloat32 ? 4 : 2; }

}  // namespace

bool brgemm_packs(at::ScalarType dtype) { return dtype != at::kFloat && blas::could_pack(dtype); }

BrgemmOperands prepare_brgemm(const at::Tensor& hidden, const at::Tensor& weight, int64_t num_valid,
                              ShardArgmaxProblem& p) {
  const int64_t batch = hidden.size(0), H = hidden.size(1);
  const int64_t blocks = (batch + kBrgemmBatchBlock - 1) / kBrgemmBatchBlock;
  const at::ScalarType dtype = weight.scalar_type();
  p.brgemm_vnni = brgemm_packs(dtype);
  BrgemmOperands ops;
  at::Tensor rows = at::zeros({blocks * kBrgemmBatchBlock, H}, hidden.options());
  rows.narrow(0, 0, batch).copy_(hidden);
  // [blocks, H, N]: block j's B operand, K-major (ldb = N)
  at::Tensor plain = rows.view({blocks, kBrgemmBatchBlock, H}).transpose(1, 2).contiguous();
  if (p.brgemm_vnni) {
    // VNNI: K in pairs; room for K rounded up to 4 (oneDNN pads the K tail)
    p.brgemm_ldk = (H + 3) / 4 * 4;
    ops.hidden_blocks = at::zeros({blocks, p.brgemm_ldk, kBrgemmBatchBlock}, hidden.options());
    for (int64_t j = 0; j < blocks; ++j)
      blas::pack(H, kBrgemmBatchBlock, kBrgemmBatchBlock, kBrgemmBatchBlock, dtype, dtype, plain[j].data_ptr(),
                 ops.hidden_blocks[j].data_ptr());
  } else {
    p.brgemm_ldk = H;
    ops.hidden_blocks = plain;
  }
  p.brgemm_hidden = ops.hidden_blocks.data_ptr();
  p.brgemm_weight_tail = nullptr;
  const int64_t full = num_valid / kTileRows * kTileRows;
  if (full < num_valid) {
    ops.weight_tail = at::zeros({kTileRows, p.ldw}, weight.options());
    ops.weight_tail.narrow(0, 0, num_valid - full).narrow(1, 0, H).copy_(weight.narrow(0, full, num_valid - full));
    p.brgemm_weight_tail = ops.weight_tail.data_ptr();
  }
  return ops;
}

void shard_argmax_tiles_brgemm(const ShardArgmaxProblem& p, int64_t tile_begin, int64_t tile_end, float* scratch,
                               uint64_t* best_keys) {
  const size_t esize = element_size(p.weight_dtype);
  const size_t b_block_bytes = static_cast<size_t>(p.brgemm_ldk * kBrgemmBatchBlock) * esize;
  const int64_t blocks = (p.batch + kBrgemmBatchBlock - 1) / kBrgemmBatchBlock;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t row0 = tile * kTileRows;
    const int64_t rows = std::min(kTileRows, p.num_valid - row0);
    const void* a = rows == kTileRows
                        ? static_cast<const char*>(p.weight) + static_cast<size_t>(row0 * p.ldw) * esize
                        : p.brgemm_weight_tail;
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t b0 = j * kBrgemmBatchBlock;
      brgemm_block(p, a, static_cast<const char*>(p.brgemm_hidden) + j * b_block_bytes, scratch);
      emit_block(p, scratch, kBrgemmBatchBlock, row0, rows, b0, std::min(kBrgemmBatchBlock, p.batch - b0), best_keys);
    }
  }
}

void brgemm_end_chunk(const ShardArgmaxProblem& p) { blas::brgemm_release(p.brgemm_vnni); }

#else  // no cpublas::brgemm in this torch

BrgemmOperands prepare_brgemm(const at::Tensor&, const at::Tensor&, int64_t, ShardArgmaxProblem&) {
  TORCH_CHECK_VALUE(false, "shard_argmax: path='brgemm' needs a torch whose ATen has cpublas::brgemm "
                           "(CPUBLAS_BRGEMM_* in ATen/native/CPUBlas.h); this build's torch has none");
  return {};
}

bool brgemm_packs(at::ScalarType) { return false; }

void shard_argmax_tiles_brgemm(const ShardArgmaxProblem&, int64_t, int64_t, float*, uint64_t*) {}

void brgemm_end_chunk(const ShardArgmaxProblem&) {}

#endif

}  // namespace cpu
}  // namespace localargmax
