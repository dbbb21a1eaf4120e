// The brgemm CPU path (see shard_argmax_brgemm.h): per vocabulary tile and
// block of N batch rows, cpublas::brgemm calls of M weight rows (brgemm_block;
// a block of step > 1 is step calls of every step-th row, lda and ldc step
// rows': the A operand read in place, lda = the weight's row stride; a
// stride below H: each tile copied, lda = H) by N batch rows (the B operand:
// hidden states transposed once per call, zero columns past the batch) over
// K = H, float32 C; then emit_block, every path's epilogue, on the tile's
// kTileRows x N block. M, N, K, lda, ldb and ldc are the same in every call
// of one problem (the last partial tile is copied to a zero-padded
// kTileRows x lda block); across problems M, N and the step may differ
// (brgemm_block: by batch size), which gives a (row, batch row) the same
// bits: each C element is one accumulation over K in oneDNN's order whatever
// M, N, lda and ldc (tests/test_cpu_brgemm.py forces every block and compares).
// Where ATen takes a VNNI B for bf16 / fp16 (brgemm_mode: AMX tiles where
// cpublas::could_pack, oneDNN's AVX-512 ukernel elsewhere) B is VNNI-packed
// here; otherwise brgemm runs with is_vnni = false, which ATen serves as it
// can (DESIGN.md, "CPU paths"). ATen reads torch.backends.mkldnn.enabled at
// every call; a call reads it once, and a block ATen ran otherwise (it
// refuses the VNNI B, or float32 finds the flag off) makes the caller redo
// the whole call without oneDNN.
#include "shard_argmax_brgemm.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
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

namespace {
// set_brgemm_block (tests only): (m * 256 + n) * 8 + step, 0 = the rule
std::atomic<int64_t> g_forced_block{0};
}  // namespace

BrgemmBlock brgemm_block(int64_t batch, int64_t hidden_size, bool amx) {
  if (amx) {
    const int64_t n = batch <= 16 ? 16 : batch <= 32 ? 32 : 64;
    // short K: 64 weight rows a block (fewer, longer calls), each call every
    // 2nd / 4th row of the 64 (measured faster than 64 rows in order)
    if (hidden_size <= 1024) return {64, n, batch <= 32 ? int64_t{2} : int64_t{4}};
    return {batch <= 16 ? int64_t{32} : int64_t{16}, n, 1};
  }
  return {kTileRows, batch <= 16 ? int64_t{16} : int64_t{32}, 1};
}

BrgemmBlock brgemm_block_in_use(int64_t batch, int64_t hidden_size, bool amx) {
  const int64_t forced = g_forced_block.load();
  if (forced != 0) return {forced / 8 / 256, forced / 8 % 256, forced % 8};
  return brgemm_block(batch, hidden_size, amx);
}

void set_brgemm_block(int64_t m, int64_t n, int64_t step) {
  const auto size = [](int64_t v) { return v == 16 || v == 32 || v == 64; };
  TORCH_CHECK_VALUE((m == 0 && n == 0 && step == 1) ||
                        (size(m) && size(n) && (step == 1 || step == 2 || step == 4) && m / step >= 16),
                    "_brgemm_block: m and n must each be 16, 32 or 64 and step 1, 2 or 4 with m / step >= 16 "
                    "(or 0, 0, 1: the rule), got ",
                    m, ", ", n, ", ", step);
  g_forced_block.store(m == 0 ? 0 : (m * 256 + n) * 8 + step);
}

#if LAM_HAVE_BRGEMM
namespace blas = at::native::cpublas;

namespace {

std::atomic<bool> g_epilogue{true};  // set_brgemm_epilogue (benchmark only)
std::atomic<int64_t> g_calls{0};     // brgemm_calls (tests only)

bool mkldnn_enabled() { return at::globalContext().userEnabledMkldnn(); }

// C[M, N] (rows ldc apart) = A[M, H] (rows lda apart) x B block. False
// where ATen did not run it on the kernel the call decided.
bool brgemm_call(const ShardArgmaxProblem& p, const void* a, const void* b, float* c, int64_t M, int64_t lda,
                 int64_t ldc) {
  const int64_t N = p.brgemm_n, K = p.hidden_size;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (K == 0) {  // an empty sum is +0.0 (as every other path); oneDNN cannot make a K = 0 kernel
    for (int64_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
    return true;
  }
  try {
    switch (p.weight_dtype) {
      case WeightDtype::kBFloat16:
        blas::brgemm(M, N, K, lda, N, ldc, false, static_cast<const at::BFloat16*>(a),
                     static_cast<const at::BFloat16*>(b), c, p.brgemm_vnni);
        break;
      case WeightDtype::kFloat16:
        blas::brgemm(M, N, K, lda, N, ldc, false, static_cast<const at::Half*>(a), static_cast<const at::Half*>(b), c,
                     p.brgemm_vnni);
        break;
      default:
        blas::brgemm(M, N, K, lda, N, ldc, false, static_cast<const float*>(a), static_cast<const float*>(b), c, false);
    }
  } catch (const c10::Error&) {
    if (!p.brgemm_vnni) throw;
    return false;  // ATen refused the VNNI B: the flag went off since the call read it
  }
  return !p.brgemm_recheck || mkldnn_enabled();  // float32: ATen may have run its gemm fallback
}

}  // namespace

namespace {

size_t element_size(WeightDtype dtype) { return dtype == WeightDtype::kFloat32 ? 4 : 2; }

}  // namespace

// Whether ATen runs brgemm with a VNNI B (is_vnni = true) for T here: a
// 2 x 32 x 2 product of small integers (N does not change the answer), exact in any order. 1: it does; 0:
// oneDNN cannot (or computes it wrong); -1: ATen refused, which a flag
// switched off since the caller read it may have caused (not remembered).
template <typename T>
int vnni_probe() {
  const int64_t M = 2, N = 32, K = 2;
  std::vector<T> a(M * K), b(K * N);
  std::vector<float> c(M * N, -1.0f);
  for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<T>(static_cast<float>(i + 1));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) b[n * K + k] = static_cast<T>(static_cast<float>(n % 5 - k));  // VNNI: [K/2][N][2]
  try {
    const BrgemmChunk release(true);
    blas::brgemm(M, N, K, K, N, N, false, a.data(), b.data(), c.data(), true);
  } catch (const c10::Error&) {
    return -1;
  } catch (const std::exception&) {  // dnnl::error: oneDNN cannot
    return 0;
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float want = static_cast<float>((2 * m + 1) * (n % 5) + (2 * m + 2) * (n % 5 - 1));
      if (c[m * N + n] != want) return 0;
    }
  return 1;
}

const char* brgemm_mode(at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return "plain";
  if (!mkldnn_enabled()) return "plain";  // ATen's own check
  if (blas::could_pack(dtype)) return "amx";
  static std::atomic<int> bf16{-1}, fp16{-1};
  std::atomic<int>& known = dtype == at::kBFloat16 ? bf16 : fp16;
  int runs = known.load();
  if (runs < 0) {
    runs = dtype == at::kBFloat16 ? vnni_probe<at::BFloat16>() : vnni_probe<at::Half>();
    if (runs >= 0) known.store(runs);
  }
  return runs == 1 ? "vnni" : "plain";
}

bool brgemm_serves(at::ScalarType dtype, bool flag_free) {
  return dtype != at::kFloat || (!flag_free && mkldnn_enabled());
}

BrgemmOperands prepare_brgemm(const at::Tensor& hidden, const at::Tensor& weight, int64_t num_valid,
                              ShardArgmaxProblem& p, bool flag_free) {
  const int64_t batch = hidden.size(0), H = hidden.size(1);
  const at::ScalarType dtype = weight.scalar_type();
  const BrgemmBlock block = brgemm_block_in_use(batch, H, std::string(brgemm_mode(dtype)) == "amx");
  p.brgemm_m = block.m;
  p.brgemm_n = block.n;
  p.brgemm_step = block.step;
  const int64_t N = block.n;
  const int64_t blocks = (batch + N - 1) / N;
  p.brgemm_vnni = !flag_free && H % 2 == 0 && std::string(brgemm_mode(dtype)) != "plain";
  p.brgemm_recheck = dtype == at::kFloat;
  p.brgemm_lda = std::max(p.ldw, H);
  BrgemmOperands ops;
  at::Tensor rows = at::zeros({blocks * N, H}, hidden.options());
  rows.narrow(0, 0, batch).copy_(hidden);
  p.brgemm_ldk = H;
  if (p.brgemm_vnni) {
    // VNNI (the layout cpublas::pack writes, as SGLang's CPU kernels pack it
    // themselves): [blocks][H / 2][N][2], element (k, n) at ((k / 2) N + n) 2 + k % 2
    ops.hidden_blocks = rows.view({blocks, N, H / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  } else {
    // [blocks][H][N]: K-major (ldb = N)
    ops.hidden_blocks = rows.view({blocks, N, H}).transpose(1, 2).contiguous();
  }
  p.brgemm_hidden = ops.hidden_blocks.data_ptr();
  p.brgemm_weight_tail = nullptr;
  const int64_t full = num_valid / kTileRows * kTileRows;
  if (full < num_valid) {
    ops.weight_tail = at::zeros({kTileRows, p.brgemm_lda}, weight.options());
    ops.weight_tail.narrow(0, 0, num_valid - full).narrow(1, 0, H).copy_(weight.narrow(0, full, num_valid - full));
    p.brgemm_weight_tail = ops.weight_tail.data_ptr();
  }
  return ops;
}

void shard_argmax_tiles_brgemm(const ShardArgmaxProblem& p, int64_t tile_begin, int64_t tile_end, float* scratch,
                               uint64_t* best_keys) {
  const size_t esize = element_size(p.weight_dtype);
  const int64_t N = p.brgemm_n, M = p.brgemm_m, step = p.brgemm_step;
  const size_t b_block_bytes = static_cast<size_t>(p.brgemm_ldk * N) * esize;
  const int64_t blocks = (p.batch + N - 1) / N;
  const size_t row_bytes = static_cast<size_t>(p.hidden_size) * esize;
  const bool epilogue = g_epilogue.load(std::memory_order_relaxed);
  std::vector<char> copied(p.brgemm_lda != p.ldw ? kTileRows * row_bytes : 0);  // rows brgemm_lda = H apart
  for (int64_t tile = tile_begin; tile < tile_end && !p.brgemm_refused->load(std::memory_order_relaxed); ++tile) {
    const int64_t row0 = tile * kTileRows;
    const int64_t rows = std::min(kTileRows, p.num_valid - row0);
    const char* first = static_cast<const char*>(p.weight) + static_cast<size_t>(row0 * p.ldw) * esize;
    const void* a = first;
    if (rows < kTileRows) {
      a = p.brgemm_weight_tail;
    } else if (!copied.empty()) {
      for (int64_t r = 0; r < kTileRows; ++r)
        std::memcpy(copied.data() + r * row_bytes, first + static_cast<size_t>(r * p.ldw) * esize, row_bytes);
      a = copied.data();
    }
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t b0 = j * N;
      const char* b = static_cast<const char*>(p.brgemm_hidden) + j * b_block_bytes;
      for (int64_t m0 = 0; m0 < kTileRows; m0 += M) {
        for (int64_t q = m0; q < m0 + step; ++q) {  // rows q, q + step, ...: C rows in place (ldc = step N)
          if (!brgemm_call(p, static_cast<const char*>(a) + static_cast<size_t>(q * p.brgemm_lda) * esize, b,
                           scratch + q * N, M / step, step * p.brgemm_lda, step * N)) {
            p.brgemm_refused->store(true);
            return;
          }
        }
      }
      if (epilogue) emit_block(p, scratch, N, row0, rows, b0, std::min(N, p.batch - b0), best_keys);
    }
  }
}

void set_brgemm_epilogue(bool on) { g_epilogue.store(on); }
bool brgemm_epilogue() { return g_epilogue.load(); }
int64_t brgemm_calls() { return g_calls.exchange(0); }

BrgemmChunk::~BrgemmChunk() {
  if (!vnni_) return;
  try {
    blas::brgemm_release(true);
  } catch (const std::exception&) {  // a destructor must not throw; nothing is left configured to release
  }
}

#else  // no cpublas::brgemm in this torch

bool brgemm_serves(at::ScalarType, bool) { return true; }  // prepare_brgemm refuses

BrgemmOperands prepare_brgemm(const at::Tensor&, const at::Tensor&, int64_t, ShardArgmaxProblem&, bool) {
  TORCH_CHECK_VALUE(false, "shard_argmax: path='brgemm' needs a torch whose ATen has cpublas::brgemm "
                           "(CPUBLAS_BRGEMM_* in ATen/native/CPUBlas.h); this build's torch has none");
  return {};
}

const char* brgemm_mode(at::ScalarType) { return "plain"; }

void set_brgemm_epilogue(bool) {}
bool brgemm_epilogue() { return true; }
int64_t brgemm_calls() { return 0; }

void shard_argmax_tiles_brgemm(const ShardArgmaxProblem&, int64_t, int64_t, float*, uint64_t*) {}

BrgemmChunk::~BrgemmChunk() {}

#endif

}  // namespace cpu
}  // namespace localargmax
