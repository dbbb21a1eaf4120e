// CUDA implementations of localargmax::shard_argmax, shard_sample and
// shard_topk: one pass over the weight shard, the reduction taken in the same
// pass, the logits never written.
//
// Layout: a block of kWarps warps owns kRowsPerBlock vocabulary rows; each
// warp takes rows in turn and computes the dot product of the row with NB
// batch rows at once (the weight row is read once for all of them). A lane
// reads 16-byte vectors at k = (i * 32 + lane) * kVec; its float32 partial
// sums run over i in order, then a fixed xor-butterfly over the 32 lanes:
// the reduction order depends on k only (DESIGN.md rule 5). Each block folds
// its best key per batch row into the output with a 64-bit atomicMax; the
// output is zeroed on the same stream first. Batch rows beyond NB are walked
// by blockIdx.y in a grid-stride loop (grid y stays <= 65535).
//
// bf16 / fp16 argmax and sample have two more paths, chosen per call by
// pick_path() from the ops' `path` argument ("auto" by default; the benchmark
// forces each path to time them side by side):
//   "mma"  the tensor-core fused kernel (shard_argmax_mma_kernel.cuh, sm_80+);
//   "gemm" for large batches: cuBLAS float32 logits for a chunk of batch rows,
//          then logits_to_keys_kernel folds them into the same keys.
// The kernel above ("simt") serves fp32, top-k, and shapes the mma kernel
// does not take (hidden_size or strides not multiples of 8, unaligned data).
// This file holds the ops' entry points, builds the ShardArgmaxProblem and
// picks the path; each path lives in its own translation unit
// (shard_argmax_paths.h), where the torch-free shard_argmax_launch.cuh, which
// the host emulation (csrc/emu/) runs too, picks the instantiation and grid.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

#include "../checks.h"
#include "../impl_shard_ops.h"

#include "shard_argmax_launch.cuh"
#include "shard_argmax_paths.h"

namespace localargmax {
namespace cuda {
namespace {

// Elements between rows of a 2-D tensor whose rows are contiguous; a single
// row's stride(0) is arbitrary, so it counts as its row length.
int64_t row_stride(const at::Tensor& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

// C++ `auto` for bf16 / fp16 argmax and sample (direct torch.ops callers; localargmax.ops follows
// the dispatch table, localargmax/dispatch_table.json). PREDICTED, UNMEASURED: the bandwidth model's
// choices for the pipelined tensor-core kernel on an H200 (localargmax/bench/predict.py,
// `localargmax-bench --predict`); localargmax/dispatch.py mirrors them (CPP_GEMM_MIN_BATCH,
// CPP_SIMT_MAX_BATCH, CPP_SIMT_MAX_ROWS_PER_SM; tests/test_dispatch.py reads these lines).
// gemm from this batch (the model's crossover against choose_mma_variant's pipelined variants
// with the smallest worst slowdown over the engine shapes, 1.00x; predict.cpp_defaults):
constexpr int64_t kDefaultGemmMinBatch = 65;
// simt at batch <= kSimtMaxBatch on shards of fewer than kSimtMaxRowsPerSm rows per SM
// (weight.size(0), padding included: equal on every rank). 0 = never: the model puts the
// pipelined variants ahead of simt at every batch on the tp-8 shards (0.89-0.92 of copy
// against 0.86-0.90 at batch 1):
constexpr int64_t kSimtMaxBatch = 0;
constexpr int64_t kSimtMaxRowsPerSm = 256;

enum class Path { kSimt, kMma, kGemm };

// Whether the tensor-core kernel takes this problem.
template <typename T>
bool mma_ok(const ShardArgmaxProblem<T>& p, const at::Tensor& weight) {
  if (weight.scalar_type() != at::kBFloat16 && weight.scalar_type() != at::kHalf) return false;
  // (cudaDeviceGetAttribute, not ATen/cuda/CUDAContext.h: that header needs
  // cuSPARSE headers, which a minimal toolkit such as CI's lacks.)
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, weight.get_device()));
  return major >= 8 && mma_takes(p);
}

// Parses "mma/<id>" (a variant of the MmaVariant table, shard_argmax_launch.cuh): the id, or -1 for
// any other path; an id that is not in the table raises ValueError naming the path.
int forced_mma_variant(const std::string& path) {
  if (path.rfind("mma/", 0) != 0) return -1;
  const std::string digits = path.substr(4);
  const bool number = !digits.empty() && digits.size() <= 3 &&
                      digits.find_first_not_of("0123456789") == std::string::npos && (digits == "0" || digits[0] != '0');
  const int id = number ? std::stoi(digits) : -1;
  TORCH_CHECK_VALUE(id >= 0 && id < kNumMmaVariants, "shard_argmax: path='", path,
                    "' names no tensor-core variant; the ids are 0 to ", kNumMmaVariants - 1,
                    " (MmaVariant, shard_argmax_launch.cuh)");
  return id;
}

struct PathChoice {
  Path path;
  int mma_variant;  // kMma: the forced MmaVariant id, or -1 for launch_mma's own choice
};

// The `path` argument of the ops: "auto" (default), "simt", "mma", "mma/<id>" (one variant of the
// tensor-core kernel, MmaVariant) or "gemm".
// auto: top-k and float32 run on simt; bf16 / fp16 on gemm from batch kDefaultGemmMinBatch; below
// it on simt when the shard is small (weight.size(0) rows, padding included, under
// kSimtMaxRowsPerSm rows per SM: tp-8 shards) and the batch is at most kSimtMaxBatch; else on mma
// where mma_ok takes the inputs, else simt. Every input of that choice is shared by the ranks
// (rows, not num_valid). A forced path that cannot take the inputs raises ValueError naming the
// path (it never falls back silently: the paths sum in different orders).
template <typename T>
PathChoice pick_path(const ShardArgmaxProblem<T>& p, const at::Tensor& weight, bool topk_mode,
                     const std::string& path) {
  const int variant = forced_mma_variant(path);
  TORCH_CHECK_VALUE(path == "auto" || path == "simt" || path == "mma" || path == "gemm" || variant >= 0,
                    "shard_argmax: path must be 'auto', 'simt', 'mma', 'mma/<id>' or 'gemm' on CUDA, got '", path,
                    "'");
  const bool half = weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf;
  if (path == "simt") return {Path::kSimt, -1};
  // The log-partition is computed by the CUDA-core kernel and the gemm path's
  // keys kernel (the tensor-core kernel has no partition states): auto never
  // takes mma for it.
  const bool lse = p.out.block_partition != nullptr;
  TORCH_CHECK_VALUE(!lse || (path != "mma" && variant < 0), "log_partition: path='", path,
                    "' cannot compute the log-partition on CUDA; use 'auto', 'simt' or 'gemm'");
  if (path != "auto") {
    TORCH_CHECK_VALUE(!topk_mode, "shard_topk: path='", path, "' does not exist for top-k; use 'auto' or 'simt'");
    TORCH_CHECK_VALUE(half, "shard_argmax: path='", path, "' needs bfloat16 or float16 weights, got ",
                      weight.scalar_type());
  }
  if (path == "gemm") return {Path::kGemm, -1};
  if (topk_mode || !half) return {Path::kSimt, -1};
  const bool mma = mma_ok(p, weight);
  if (path != "auto") {  // "mma" or "mma/<id>"
    TORCH_CHECK_VALUE(mma, "shard_argmax: path='", path,
                      "' needs sm_80+, hidden_size and row strides multiples of 8 and 16-byte aligned hidden / "
                      "weight data");
    return {Path::kMma, variant};
  }
  if (p.batch >= kDefaultGemmMinBatch) return {Path::kGemm, -1};
  if (kSimtMaxBatch > 0 && p.batch <= kSimtMaxBatch) {
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, weight.get_device()));
    if (weight.size(0) < kSimtMaxRowsPerSm * sms) return {Path::kSimt, -1};
  }
  return {mma && !lse ? Path::kMma : Path::kSimt, -1};
}

// Returns the number of blocks (grid x) of the kernel that wrote the keys:
// the rows of out.block_partition when the log-partition is on.
template <typename T>
int64_t launch_typed(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias_t,
                  const at::Tensor& bias_f, int64_t vocab_start, int64_t num_valid, const ShardReduce& out,
                  bool topk_mode, const std::string& path) {
  const ShardArgmaxProblem<T> p{reinterpret_cast<const T*>(hidden.data_ptr()),
                                row_stride(hidden),
                                reinterpret_cast<const T*>(weight.data_ptr()),
                                row_stride(weight),
                                bias_t.defined() ? reinterpret_cast<const T*>(bias_t.data_ptr()) : nullptr,
                                bias_f.defined() ? bias_f.data_ptr<float>() : nullptr,
                                hidden.size(0),
                                hidden.size(1),
                                num_valid,
                                vocab_start,
                                out};
  const PathChoice chosen = pick_path(p, weight, topk_mode, path);  // float32: always kSimt (or it raised)
  if constexpr (!std::is_same_v<T, float>) {
    if (chosen.path == Path::kGemm) {
      run_gemm(p, hidden, weight);
      return keys_blocks(p);
    }
    if (chosen.path == Path::kMma) {
      run_mma(p, chosen.mma_variant);
      return 0;
    }
  }
  run_simt(p, topk_mode);
  return simt_blocks(p);
}

// Runs the fused kernel (or the gemm path, see pick_path) in one mode on the
// current stream, under a device guard. Returns launch_typed's block count.
int64_t launch(const at::Tensor& hidden_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
            int64_t vocab_start, int64_t num_valid, const ShardReduce& out, bool topk_mode, const std::string& path) {
  // The path and the vector width (hence the summation order) may depend on
  // alignment; hidden is small, so a misaligned or oddly strided one is copied
  // to a fresh (aligned, contiguous) buffer and the choice depends on the
  // weight and the shared arguments only. Ranks must hold equally aligned
  // weight shards (any tensor torch allocates is; see DESIGN.md, CUDA rules).
  const int64_t vec = 16 / hidden_in.element_size();
  const bool hidden_ok = hidden_in.stride(1) == 1 && reinterpret_cast<uintptr_t>(hidden_in.data_ptr()) % 16 == 0 &&
                         row_stride(hidden_in) % vec == 0;
  const at::Tensor hidden =
      hidden_ok ? hidden_in : at::empty(hidden_in.sizes(), hidden_in.options()).copy_(hidden_in);
  TORCH_CHECK_VALUE(num_valid < (int64_t{1} << 31) - kRowsPerBlock,
                    "shard_argmax: a CUDA shard holds fewer than 2**31 rows, got num_valid=", num_valid);
  TORCH_CHECK_VALUE(hidden.size(1) < (int64_t{1} << 30), "shard_argmax: hidden_size must be < 2**30 on CUDA, got ",
                    hidden.size(1));
  at::Tensor bias_t, bias_f;
  if (bias.has_value()) {
    if (bias->scalar_type() == at::kFloat && weight.scalar_type() != at::kFloat)
      bias_f = bias->contiguous();
    else
      bias_t = bias->contiguous();
  }
  switch (weight.scalar_type()) {
    case at::kFloat:
      return launch_typed<float>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, out, topk_mode, path);
    case at::kHalf:
      return launch_typed<__half>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, out, topk_mode, path);
    case at::kBFloat16:
      return launch_typed<__nv_bfloat16>(hidden, weight, bias_t, bias_f, vocab_start, num_valid, out, topk_mode,
                                         path);
    default: TORCH_CHECK_TYPE(false, "shard_argmax: unsupported dtype ", weight.scalar_type());
  }
  return 0;
}

unsigned long long* key_ptr(at::Tensor& t) { return reinterpret_cast<unsigned long long*>(t.data_ptr<int64_t>()); }

at::Tensor shard_argmax_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, int64_t vocab_start, int64_t num_valid,
                             c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  const c10::cuda::CUDAGuard guard(weight.device());
  at::Tensor keys = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kLong));  // memset on the current stream
  if (hidden.size(0) == 0 || num_valid == 0) return keys;
  launch(hidden, weight, bias, vocab_start, num_valid, ShardReduce{key_ptr(keys), nullptr, 1, nullptr, 0, 0}, false,
         std::string(path));
  return keys;
}

at::Tensor shard_sample_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             int64_t vocab_start, int64_t num_valid, const at::Tensor& temperature, int64_t seed,
                             int64_t offset, c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_sample_args(hidden, temperature, offset);
  const c10::cuda::CUDAGuard guard(weight.device());
  at::Tensor keys = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kLong));
  if (hidden.size(0) == 0 || num_valid == 0) return keys;
  const at::Tensor t = temperature.contiguous();
  launch(hidden, weight, bias, vocab_start, num_valid,
         ShardReduce{key_ptr(keys), nullptr, 1, t.data_ptr<float>(), static_cast<uint64_t>(seed),
                     static_cast<uint64_t>(offset)},
         false, std::string(path));
  return keys;
}

// Top-k: each block's top-k per batch row, then torch.topk over the blocks'
// lists (on sign-flipped keys: signed order == unsigned order).
at::Tensor shard_topk_cuda(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           int64_t vocab_start, int64_t num_valid, int64_t k, c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_topk_arg(k);
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t batch = hidden.size(0);
  if (batch == 0 || num_valid == 0) return at::zeros({batch, k}, hidden.options().dtype(at::kLong));
  const int64_t blocks_x = (num_valid + kRowsPerBlock - 1) / kRowsPerBlock;
  at::Tensor block_topk = at::empty({blocks_x, batch, k}, hidden.options().dtype(at::kLong));
  launch(hidden, weight, bias, vocab_start, num_valid, ShardReduce{nullptr, key_ptr(block_topk), static_cast<int>(k),
                                                                   nullptr, 0, 0},
         true, std::string(path));
  const int64_t sign = static_cast<int64_t>(kSignFlip);  // signed order of key ^ sign == unsigned order of key
  at::Tensor flipped = block_topk.permute({1, 0, 2}).reshape({batch, blocks_x * k}).bitwise_xor(sign);
  const int64_t kept = std::min<int64_t>(k, blocks_x * k);
  return std::get<0>(flipped.topk(kept, 1, true, true)).bitwise_xor(sign);
}

// The *_lse ops: the same launches with per-block log-partition states
// (simt or gemm path, see pick_path), merged in block order into pairs.
static_assert(sizeof(PartitionState) == 16, "PartitionState is 16 bytes: 4 int32 words per state");

struct Partition {
  at::Tensor pairs;   // [batch, 2] float32
  at::Tensor states;  // [blocks * batch] PartitionState, as int32 words
  int64_t blocks;

  Partition(const at::Tensor& hidden, int64_t num_valid)
      : blocks((num_valid + kRowsPerBlock - 1) / kRowsPerBlock) {
    const int64_t batch = hidden.size(0);
    pairs = at::empty({batch, 2}, hidden.options().dtype(at::kFloat));
    if (batch == 0 || num_valid == 0) {  // an empty shard: (-inf, 0) (fills on the current stream)
      pairs.select(1, 0).fill_(-std::numeric_limits<float>::infinity());
      pairs.select(1, 1).fill_(0.0);
      return;
    }
    states = at::empty({blocks * batch * 4}, hidden.options().dtype(at::kInt));
  }
  PartitionState* state_ptr() { return reinterpret_cast<PartitionState*>(states.data_ptr<int32_t>()); }
  // used: the blocks the chosen path wrote (<= blocks: the simt kernel's count, the most of any path)
  void merge(int64_t batch, const float* temperature, int64_t used) {
    TORCH_CHECK(used > 0 && used <= blocks, "log_partition: ", used, " blocks of states for ", blocks);
    launch_merge_partition(state_ptr(), used, batch, temperature, pairs.data_ptr<float>(), CudaLaunch{});
  }
};

ShardReduce with_partition(ShardReduce out, Partition& part, double scale, double soft_cap) {
  out.block_partition = part.state_ptr();
  out.scale = static_cast<float>(scale);
  out.soft_cap = static_cast<float>(soft_cap);
  return out;
}

std::tuple<at::Tensor, at::Tensor> shard_argmax_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                         int64_t num_valid, double scale, double soft_cap,
                                                         c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_transform_args(scale, soft_cap);
  const c10::cuda::CUDAGuard guard(weight.device());
  at::Tensor keys = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kLong));
  Partition part(hidden, num_valid);
  if (hidden.size(0) == 0 || num_valid == 0) return {keys, part.pairs};
  const ShardReduce out{key_ptr(keys), nullptr, 1, nullptr, 0, 0};
  const int64_t used = launch(hidden, weight, bias, vocab_start, num_valid, with_partition(out, part, scale, soft_cap),
                              false, std::string(path));
  part.merge(hidden.size(0), nullptr, used);
  return {keys, part.pairs};
}

std::tuple<at::Tensor, at::Tensor> shard_sample_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                         int64_t num_valid, const at::Tensor& temperature,
                                                         int64_t seed, int64_t offset, double scale, double soft_cap,
                                                         c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_sample_args(hidden, temperature, offset);
  check_transform_args(scale, soft_cap);
  const c10::cuda::CUDAGuard guard(weight.device());
  at::Tensor keys = at::zeros({hidden.size(0)}, hidden.options().dtype(at::kLong));
  Partition part(hidden, num_valid);
  if (hidden.size(0) == 0 || num_valid == 0) return {keys, part.pairs};
  const at::Tensor t = temperature.contiguous();
  const ShardReduce out{key_ptr(keys), nullptr, 1, t.data_ptr<float>(), static_cast<uint64_t>(seed),
                        static_cast<uint64_t>(offset)};
  const int64_t used = launch(hidden, weight, bias, vocab_start, num_valid, with_partition(out, part, scale, soft_cap),
                              false, std::string(path));
  part.merge(hidden.size(0), t.data_ptr<float>(), used);
  return {keys, part.pairs};
}

std::tuple<at::Tensor, at::Tensor> shard_topk_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                       const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                       int64_t num_valid, int64_t k, double scale, double soft_cap,
                                                       c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_topk_arg(k);
  check_transform_args(scale, soft_cap);
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t batch = hidden.size(0);
  Partition part(hidden, num_valid);
  if (batch == 0 || num_valid == 0) return {at::zeros({batch, k}, hidden.options().dtype(at::kLong)), part.pairs};
  at::Tensor block_topk = at::empty({part.blocks, batch, k}, hidden.options().dtype(at::kLong));
  const ShardReduce out{nullptr, key_ptr(block_topk), static_cast<int>(k), nullptr, 0, 0};
  const int64_t used = launch(hidden, weight, bias, vocab_start, num_valid, with_partition(out, part, scale, soft_cap),
                              true, std::string(path));
  part.merge(batch, nullptr, used);
  const int64_t sign = static_cast<int64_t>(kSignFlip);
  at::Tensor flipped = block_topk.permute({1, 0, 2}).reshape({batch, part.blocks * k}).bitwise_xor(sign);
  const int64_t kept = std::min<int64_t>(k, part.blocks * k);
  return {std::get<0>(flipped.topk(kept, 1, true, true)).bitwise_xor(sign), part.pairs};
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(localargmax, CUDA, m) { LOCALARGMAX_IMPL_SHARD_OPS(m, cuda, cuda); }

}  // namespace localargmax
