// The brgemm CPU path (see shard_argmax_brgemm.h): per vocabulary tile, one
// cpublas::brgemm call of M = kTileRows weight rows (the A operand read in
// place, lda = the weight's row stride) by N = kBrgemmBatchBlock batch rows
// (the B operand: hidden states transposed once per call, zero columns past
// the batch) over K = H, float32 C; then emit_block, every path's epilogue.
// M, N, K, lda, ldb and ldc are the same in every call of one problem (the
// last partial tile is copied to a zero-padded kTileRows x ldw block), so
// every (row, batch row) runs the same oneDNN kernel wherever it sits.
// Where ATen takes a VNNI B for bf16 / fp16 (brgemm_mode: AMX tiles where
// cpublas::could_pack, oneDNN's AVX-512 ukernel elsewhere) B is VNNI-packed
// here; otherwise brgemm runs with is_vnni = false, which ATen serves as it
// can (DESIGN.md, "CPU paths").
#include "shard_argmax_brgemm.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

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
  if (K == 0) {  // an empty sum is +0.0 (as every other path); oneDNN cannot make a K = 0 kernel
    std::fill(c, c + M * N, 0.0f);
    return;
  }
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

// Whether ATen runs brgemm with a VNNI B (is_vnni = true) for T here: a
// 2 x 32 x 2 product of small integers, exact in any order.
template <typename T>
bool vnni_runs() {
  const int64_t M = 2, N = kBrgemmBatchBlock, K = 2;
  std::vector<T> a(M * K), b(K * N);
  std::vector<float> c(M * N, -1.0f);
  for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<T>(static_cast<float>(i + 1));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) b[n * K + k] = static_cast<T>(static_cast<float>(n % 5 - k));  // VNNI: [K/2][N][2]
  try {
    blas::brgemm(M, N, K, K, N, N, false, a.data(), b.data(), c.data(), true);
    blas::brgemm_release(true);
  } catch (const std::exception&) {  // c10::Error (ATen refuses) or dnnl::error (oneDNN cannot)
    return false;
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float want = static_cast<float>((2 * m + 1) * (n % 5) + (2 * m + 2) * (n % 5 - 1));
      if (c[m * N + n] != want) return false;
    }
  return true;
}

const char* brgemm_mode(at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return "plain";
  if (blas::could_pack(dtype)) return "amx";
  if (!at::globalContext().userEnabledMkldnn()) return "plain";  // ATen's own check, per call
  static const bool bf16 = vnni_runs<at::BFloat16>();
  static const bool fp16 = vnni_runs<at::Half>();
  return (dtype == at::kBFloat16 ? bf16 : fp16) ? "vnni" : "plain";
}

BrgemmOperands prepare_brgemm(const at::Tensor& hidden, const at::Tensor& weight, int64_t num_valid,
                              ShardArgmaxProblem& p) {
  const int64_t batch = hidden.size(0), H = hidden.size(1);
  const int64_t blocks = (batch + kBrgemmBatchBlock - 1) / kBrgemmBatchBlock;
  const at::ScalarType dtype = weight.scalar_type();
  p.brgemm_vnni = H % 2 == 0 && std::string(brgemm_mode(dtype)) != "plain";
  BrgemmOperands ops;
  at::Tensor rows = at::zeros({blocks * kBrgemmBatchBlock, H}, hidden.options());
  rows.narrow(0, 0, batch).copy_(hidden);
  p.brgemm_ldk = H;
  if (p.brgemm_vnni) {
    // VNNI (the layout cpublas::pack writes, as SGLang's CPU kernels pack it
    // themselves): [blocks][H / 2][N][2], element (k, n) at ((k / 2) N + n) 2 + k % 2
    ops.hidden_blocks = rows.view({blocks, kBrgemmBatchBlock, H / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  } else {
    // [blocks][H][N]: K-major (ldb = N)
    ops.hidden_blocks = rows.view({blocks, kBrgemmBatchBlock, H}).transpose(1, 2).contiguous();
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

const char* brgemm_mode(at::ScalarType) { return "plain"; }

void shard_argmax_tiles_brgemm(const ShardArgmaxProblem&, int64_t, int64_t, float*, uint64_t*) {}

void brgemm_end_chunk(const ShardArgmaxProblem&) {}

#endif

}  // namespace cpu
}  // namespace localargmax
