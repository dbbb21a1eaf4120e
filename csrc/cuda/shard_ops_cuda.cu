// CUDA implementations of the six shard ops (shard_argmax, shard_sample,
// shard_topk and their _lse twins), all through shard_op: one pass over the
// weight shard, the reduction taken in the same pass, the logits never
// written.
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
// bf16 / fp16 have two more paths, chosen per call by pick_path() from the
// ops' `path` argument ("auto" by default; the benchmark forces each path to
// time them side by side):
//   "mma"  the tensor-core fused kernel (fused_keys_mma.cuh, sm_80+; top-k too);
//   "gemm" argmax and sample at large batches: cuBLAS float32 logits for a
//          chunk of batch rows, then logits_to_keys_kernel folds them into the
//          same keys.
// The kernel above ("simt") serves fp32 and shapes the mma kernel does not
// take (hidden_size or strides not multiples of 8, unaligned data).
// This file holds the ops' entry points, builds the ShardArgmaxProblem and
// picks the path; each path lives in its own translation unit
// (shard_paths.h), where the torch-free shard_launch.cuh, which
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

#include "shard_launch.cuh"
#include "shard_paths.h"
#include "step_kernels.cuh"

namespace localargmax {
namespace cuda {
namespace {

// Elements between rows of a 2-D tensor whose rows are contiguous; a single
// row's stride(0) is arbitrary, so it counts as its row length.
int64_t row_stride(const at::Tensor& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

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

// Parses "mma/<name>" (a row of kMmaConfigs, mma_configs.h; what the Python
// layer sends for its private config keyword): the row, or -1 for any other
// path; a name that is not in the table raises ValueError naming it.
int forced_mma_config(const std::string& path) {
  if (path.rfind("mma/", 0) != 0) return -1;
  const int i = mma_config_index(path.c_str() + 4);
  if (i < 0) {
    std::string names;
    for (const MmaConfig& c : kMmaConfigs) names += std::string(names.empty() ? "" : ", ") + c.name;
    TORCH_CHECK_VALUE(false, "shard_argmax: mma config '", path.substr(4), "' is not one of ", names,
                      " (mma_configs.h)");
  }
  return i;
}

struct PathChoice {
  Path path;
  int mma_config;  // kMma: the forced row of kMmaConfigs, or -1 for launch_mma's own choice
};

// vLLM's noise on CUDA runs on the gemm path alone (key_of): path "auto" or
// "gemm", bfloat16 / float16 weights, at most kGemmMaxRows rows. Checked
// before an empty shard returns, so every rank refuses alike.
void check_noise_path(const std::string& path, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(path == "auto" || path == "gemm",
                    "shard_sample: noise_seed (vLLM's noise) takes path 'gemm' (or 'auto') on CUDA, got '", path, "'");
  TORCH_CHECK_VALUE(weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf,
                    "shard_sample: noise_seed (vLLM's noise) on CUDA needs bfloat16 or float16 weights (the gemm ",
                    "path), got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.size(0) <= kGemmMaxRows, "shard_sample: noise_seed (vLLM's noise) on CUDA takes shards of ",
                    "at most ", kGemmMaxRows, " rows (the gemm path), got ", weight.size(0));
}

// The `path` argument of the ops: "auto" (default), "simt", "mma", "mma/<name>" (one config of the
// tensor-core kernel, mma_configs.h) or "gemm".
// auto: choose_cuda_path (mma_configs.h), the same with or without the log-partition. Every
// input of that choice is shared by the ranks. A forced path that cannot take the inputs raises ValueError naming the
// path (it never falls back silently: the paths sum in different orders). vLLM's noise
// (p.out.noise_seed) takes the gemm path, "auto" or not (key_of).
template <typename T>
PathChoice pick_path(const ShardArgmaxProblem<T>& p, const at::Tensor& weight, bool topk_mode,
                     const std::string& path) {
  const int config = forced_mma_config(path);
  TORCH_CHECK_VALUE(path == "auto" || path == "simt" || path == "mma" || path == "gemm" || config >= 0,
                    "shard_argmax: path must be 'auto', 'simt', 'mma' or 'gemm' on CUDA, got '", path, "'");
  const bool half = weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf;
  if (p.out.noise_seed != nullptr) {  // vLLM's noise: the gemm path alone (key_of; check_noise_path)
    return {Path::kGemm, -1};
  }
  if (path == "simt") return {Path::kSimt, -1};
  if (path != "auto") {
    TORCH_CHECK_VALUE(!topk_mode || path != "gemm", "shard_topk: path='gemm' does not exist for top-k; use 'auto', "
                      "'mma' or 'simt'");
    TORCH_CHECK_VALUE(half, "shard_argmax: path='", path, "' needs bfloat16 or float16 weights, got ",
                      weight.scalar_type());
  }
  TORCH_CHECK_VALUE(path != "gemm" || weight.size(0) <= kGemmMaxRows, "shard_argmax: path='gemm' takes shards of at most ",
                    kGemmMaxRows, " rows (cuBLAS failed on 2**31 - 1), got ", weight.size(0),
                    "; use 'mma' or 'simt'");
  if (path == "gemm") return {Path::kGemm, -1};
  const bool mma = half && mma_ok(p, weight);
  if (path != "auto") {  // "mma" or "mma/<name>"
    TORCH_CHECK_VALUE(mma, "shard_argmax: path='", path,
                      "' needs sm_80+, hidden_size and row strides multiples of 8 and 16-byte aligned hidden / "
                      "weight data");
    return {Path::kMma, config};
  }
  return {choose_cuda_path(half, topk_mode, mma, p.batch, weight.size(0)), -1};
}

// Returns the number of blocks (grid x) of the kernel that wrote the keys:
// the rows of out.block_partition when the log-partition is on.
template <typename T>
int64_t launch_typed(const at::Tensor& hidden, const at::Tensor& weight, const Bias& bias, int64_t vocab_start,
                     int64_t num_valid, const ShardReduce& out, bool topk_mode, const std::string& path) {
  const auto [bias_t, bias_f] = bias_of<T>(bias);
  const ShardArgmaxProblem<T> p{reinterpret_cast<const T*>(hidden.data_ptr()),
                                row_stride(hidden),
                                reinterpret_cast<const T*>(weight.data_ptr()),
                                row_stride(weight),
                                bias_t,
                                bias_f,
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
    if (chosen.path == Path::kMma) return topk_mode ? run_mma_topk(p, chosen.mma_config) : run_mma(p, chosen.mma_config);
  }
  run_simt(p, topk_mode);
  return simt_blocks(p);
}

// Runs the fused kernel (or the gemm path, see pick_path) in one mode on the
// current stream. Returns launch_typed's block count.
int64_t launch(const at::Tensor& hidden_in, const at::Tensor& weight, const at::Tensor& bias, int64_t vocab_start,
               int64_t num_valid, const ShardReduce& out, bool topk_mode, const std::string& path) {
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
  // One bias pointer and its dtype: float32 (with any weight) or the weight's.
  const Bias b{bias.defined() ? bias.data_ptr() : nullptr,
               bias.defined() && bias.scalar_type() == at::kFloat && weight.scalar_type() != at::kFloat};
  switch (weight.scalar_type()) {
    case at::kFloat: return launch_typed<float>(hidden, weight, b, vocab_start, num_valid, out, topk_mode, path);
    case at::kHalf: return launch_typed<__half>(hidden, weight, b, vocab_start, num_valid, out, topk_mode, path);
    case at::kBFloat16:
      return launch_typed<__nv_bfloat16>(hidden, weight, b, vocab_start, num_valid, out, topk_mode, path);
    default: TORCH_CHECK_TYPE(false, "shard_argmax: unsupported dtype ", weight.scalar_type());
  }
  return 0;
}

unsigned long long* key_ptr(const at::Tensor& t) {
  return reinterpret_cast<unsigned long long*>(t.data_ptr<int64_t>());
}

static_assert(sizeof(PartitionState) == 16, "PartitionState is 16 bytes: 4 int32 words per state");

enum class Mode { kArgmax, kSample, kTopk };

// One shard op's arguments: the six registered ops fill the fields of their
// mode (designated initializers) and shard_op runs it.
struct ShardOpArgs {
  Mode mode;
  const at::Tensor& hidden;
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  int64_t vocab_start;
  int64_t num_valid;
  c10::string_view path;
  int64_t k = 1;                            // kTopk: 1 <= k <= 64
  const at::Tensor* temperature = nullptr;  // kSample: [batch] float32
  int64_t seed = 0, offset = 0;             // kSample
  const std::optional<at::Tensor>* noise_seed = nullptr;  // kSample, noise=vllm_noise(...): [batch] int64 (with noise_pos)
  const std::optional<at::Tensor>* noise_pos = nullptr;
  bool log_partition = false;               // the *_lse ops
  double scale = 1.0, soft_cap = 0.0;       // log_partition only
  const std::optional<at::Tensor>* partition_temperature = nullptr;  // kArgmax log_partition: [batch] float32 T > 0
  at::Tensor* frame = nullptr;  // step_frame: the keys (and with send_pairs the pairs) written into this new frame
  bool send_pairs = false;
};

// (keys, pairs): keys [batch] (argmax, sample) or [batch, k] (top-k); pairs
// [batch, 2] float32 with the log-partition (each block's states merged in
// block order, see pick_path for the paths that take it), else undefined.
// Top-k: each block's top-k per batch row, then torch.topk over the blocks'
// lists (on sign-flipped keys: signed order == unsigned order).
std::tuple<at::Tensor, at::Tensor> shard_op(const ShardOpArgs& a) {
  const at::Tensor& hidden = a.hidden;
  check_shard_argmax_args(hidden, a.weight, a.bias, a.vocab_start, a.num_valid);
  if (a.mode == Mode::kTopk) check_topk_arg(a.k);
  if (a.mode == Mode::kSample) check_sample_args(hidden, *a.temperature, a.offset);
  const bool vllm_noise = a.noise_seed != nullptr && a.noise_seed->has_value();
  if (a.mode == Mode::kSample) check_noise_args(hidden, *a.noise_seed, *a.noise_pos);
  if (vllm_noise) check_noise_path(std::string(a.path), a.weight);
  if (a.log_partition) check_transform_args(a.scale, a.soft_cap);
  const bool own_t = a.partition_temperature != nullptr && a.partition_temperature->has_value();
  if (own_t) check_temperature_arg("shard_argmax", hidden, **a.partition_temperature);
  const c10::cuda::CUDAGuard guard(a.weight.device());
  const int64_t batch = hidden.size(0);
  const int64_t blocks = (a.num_valid + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool topk = a.mode == Mode::kTopk;
  const bool empty = batch == 0 || a.num_valid == 0;
  const auto longs = hidden.options().dtype(at::kLong);
  at::Tensor keys, pairs, states;
  if (a.frame != nullptr) {  // step_frame: header and zeroed keys in one launch, the kernels write behind them
    const int64_t n = batch * a.k;
    *a.frame = at::empty({kFrameHeader + n + (a.send_pairs ? batch : 0)}, longs);
    const int64_t size = n + 1 + (a.send_pairs ? kPairsFlag : 0);
    const int64_t zero = topk ? 0 : n;  // top-k's keys are copied in after its merge
    frame_init_kernel<<<static_cast<unsigned>((std::max<int64_t>(zero, 1) + kStepThreads - 1) / kStepThreads),
                        kStepThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.frame->data_ptr<int64_t>(), size, a.num_valid ? a.vocab_start + a.num_valid : 0, zero);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    keys = topk ? at::zeros({batch, a.k}, longs) : a.frame->narrow(0, kFrameHeader, n);
    if (a.send_pairs) pairs = a.frame->narrow(0, kFrameHeader + n, batch).view(at::kFloat).view({batch, 2});
  } else {
    keys = topk ? at::zeros({batch, a.k}, longs) : at::zeros({batch}, longs);  // memset on the stream
  }
  if (a.log_partition) {
    if (!pairs.defined()) pairs = at::empty({batch, 2}, hidden.options().dtype(at::kFloat));
    if (empty) {  // an empty shard: (-inf, 0)
      pairs.select(1, 0).fill_(-std::numeric_limits<float>::infinity());
      pairs.select(1, 1).fill_(0.0);
    } else {
      states = at::empty({blocks * batch * 4}, hidden.options().dtype(at::kInt));
    }
  }
  if (empty) {
    if (topk && a.frame != nullptr) a.frame->narrow(0, kFrameHeader, batch * a.k).zero_();
    return {keys, pairs};
  }
  const at::Tensor block_topk = topk ? at::empty({blocks, batch, a.k}, longs) : at::Tensor();
  const at::Tensor t = a.mode == Mode::kSample ? a.temperature->contiguous() : at::Tensor();
  const float* temperature = t.defined() ? t.data_ptr<float>() : nullptr;
  const at::Tensor noise_seed = vllm_noise ? (*a.noise_seed)->contiguous() : at::Tensor();
  const at::Tensor noise_pos = vllm_noise ? (*a.noise_pos)->contiguous() : at::Tensor();
  const at::Tensor pt = own_t ? (*a.partition_temperature)->contiguous() : at::Tensor();
  const float* sums_t = own_t ? pt.data_ptr<float>() : temperature;  // the log-partition's T (ShardReduce)
  PartitionState* partition = states.defined() ? reinterpret_cast<PartitionState*>(states.data_ptr<int32_t>()) : nullptr;
  const ShardReduce out{.keys = topk ? nullptr : key_ptr(keys),
                        .block_topk = topk ? key_ptr(block_topk) : nullptr,
                        .topk = static_cast<int>(a.k),
                        .temperature = temperature,
                        .seed = static_cast<uint64_t>(a.seed),
                        .offset = static_cast<uint64_t>(a.offset),
                        .noise_seed = vllm_noise ? noise_seed.data_ptr<int64_t>() : nullptr,
                        .noise_pos = vllm_noise ? noise_pos.data_ptr<int64_t>() : nullptr,
                        .block_partition = partition,
                        .partition_temperature = sums_t,
                        .scale = static_cast<float>(a.scale),
                        .soft_cap = static_cast<float>(a.soft_cap)};
  const at::Tensor bias = a.bias.has_value() ? a.bias->contiguous() : at::Tensor();
  const int64_t used = launch(hidden, a.weight, bias, a.vocab_start, a.num_valid, out, topk, std::string(a.path));
  if (a.log_partition) {
    // used: the blocks the chosen path wrote (<= blocks: the simt kernel's count, the most of any path)
    TORCH_CHECK(used > 0 && used <= blocks, "log_partition: ", used, " blocks of states for ", blocks);
    launch_merge_partition(partition, used, batch, sums_t, pairs.data_ptr<float>(), CudaLaunch{});
  }
  if (topk) {
    // used: the blocks the chosen path wrote (simt: blocks; mma: one list per block of its config's rows)
    TORCH_CHECK(used > 0 && used <= blocks, "shard_topk: ", used, " blocks of lists for ", blocks);
    const int64_t sign = static_cast<int64_t>(kSignFlip);  // signed order of key ^ sign == unsigned order of key
    const at::Tensor lists = block_topk.narrow(0, 0, used).permute({1, 0, 2}).reshape({batch, used * a.k});
    keys = std::get<0>(lists.bitwise_xor(sign).topk(std::min<int64_t>(a.k, used * a.k), 1, true, true))
               .bitwise_xor(sign);
    if (a.frame != nullptr) {
      if (keys.size(1) < a.k) a.frame->narrow(0, kFrameHeader, batch * a.k).zero_();
      a.frame->narrow(0, kFrameHeader, batch * a.k).view({batch, a.k}).narrow(1, 0, keys.size(1)).copy_(keys);
    }
  }
  return {keys, pairs};
}

using OptionalTensor = std::optional<at::Tensor>;

at::Tensor shard_argmax_cuda(const at::Tensor& hidden, const at::Tensor& weight, const OptionalTensor& bias,
                             int64_t vocab_start, int64_t num_valid, c10::string_view path) {
  return std::get<0>(shard_op({.mode = Mode::kArgmax, .hidden = hidden, .weight = weight, .bias = bias,
                               .vocab_start = vocab_start, .num_valid = num_valid, .path = path}));
}

at::Tensor shard_sample_cuda(const at::Tensor& hidden, const at::Tensor& weight, const OptionalTensor& bias,
                             int64_t vocab_start, int64_t num_valid, const at::Tensor& temperature, int64_t seed,
                             int64_t offset, c10::string_view path, const OptionalTensor& noise_seed,
                             const OptionalTensor& noise_pos) {
  return std::get<0>(shard_op({.mode = Mode::kSample, .hidden = hidden, .weight = weight, .bias = bias,
                               .vocab_start = vocab_start, .num_valid = num_valid, .path = path,
                               .temperature = &temperature, .seed = seed, .offset = offset,
                               .noise_seed = &noise_seed, .noise_pos = &noise_pos}));
}

at::Tensor shard_topk_cuda(const at::Tensor& hidden, const at::Tensor& weight, const OptionalTensor& bias, int64_t vocab_start,
                           int64_t num_valid, int64_t k, c10::string_view path) {
  return std::get<0>(shard_op({.mode = Mode::kTopk, .hidden = hidden, .weight = weight, .bias = bias,
                               .vocab_start = vocab_start, .num_valid = num_valid, .path = path, .k = k}));
}

std::tuple<at::Tensor, at::Tensor> shard_argmax_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                         const OptionalTensor& bias, int64_t vocab_start, int64_t num_valid,
                                                         double scale, double soft_cap, c10::string_view path,
                                                         const OptionalTensor& temperature) {
  return shard_op({.mode = Mode::kArgmax, .hidden = hidden, .weight = weight, .bias = bias,
                   .vocab_start = vocab_start, .num_valid = num_valid, .path = path, .log_partition = true,
                   .scale = scale, .soft_cap = soft_cap, .partition_temperature = &temperature});
}

std::tuple<at::Tensor, at::Tensor> shard_sample_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                         const OptionalTensor& bias, int64_t vocab_start, int64_t num_valid,
                                                         const at::Tensor& temperature, int64_t seed, int64_t offset,
                                                         double scale, double soft_cap, c10::string_view path,
                                                         const OptionalTensor& noise_seed,
                                                         const OptionalTensor& noise_pos) {
  return shard_op({.mode = Mode::kSample, .hidden = hidden, .weight = weight, .bias = bias,
                   .vocab_start = vocab_start, .num_valid = num_valid, .path = path, .temperature = &temperature,
                   .seed = seed, .offset = offset, .noise_seed = &noise_seed, .noise_pos = &noise_pos,
                   .log_partition = true, .scale = scale, .soft_cap = soft_cap});
}

std::tuple<at::Tensor, at::Tensor> shard_topk_lse_cuda(const at::Tensor& hidden, const at::Tensor& weight,
                                                       const OptionalTensor& bias, int64_t vocab_start, int64_t num_valid,
                                                       int64_t k, double scale, double soft_cap,
                                                       c10::string_view path) {
  return shard_op({.mode = Mode::kTopk, .hidden = hidden, .weight = weight, .bias = bias,
                   .vocab_start = vocab_start, .num_valid = num_valid, .path = path, .k = k,
                   .log_partition = true, .scale = scale, .soft_cap = soft_cap});
}

// localargmax::step_frame on CUDA: shard_op writing into a new frame (frame_init_kernel, then the path's
// kernels; top-k's merged keys copied in), sign-flipped in place for an all-reduce.
at::Tensor step_frame_cuda(const at::Tensor& hidden, const at::Tensor& weight, const OptionalTensor& bias,
                           int64_t vocab_start, int64_t num_valid, int64_t mode, int64_t k,
                           const OptionalTensor& temperature, int64_t seed, int64_t offset, double scale,
                           double soft_cap, bool log_partition, bool send_pairs, bool sign_flip, c10::string_view path,
                           const OptionalTensor& noise_seed, const OptionalTensor& noise_pos) {
  check_step_frame_args(mode, k, temperature, log_partition, send_pairs, sign_flip);
  at::Tensor frame;
  const OptionalTensor none;
  ShardOpArgs args{.mode = mode == kStepTopk ? Mode::kTopk : mode == kStepSample ? Mode::kSample : Mode::kArgmax,
                   .hidden = hidden, .weight = weight, .bias = bias, .vocab_start = vocab_start,
                   .num_valid = num_valid, .path = path, .k = k,
                   .temperature = mode == kStepSample ? &*temperature : nullptr, .seed = seed, .offset = offset,
                   .noise_seed = mode == kStepSample ? &noise_seed : nullptr,
                   .noise_pos = mode == kStepSample ? &noise_pos : nullptr, .log_partition = log_partition,
                   .scale = scale, .soft_cap = soft_cap,
                   .partition_temperature = mode == kStepArgmax ? &temperature : nullptr, .frame = &frame,
                   .send_pairs = send_pairs};
  const auto [keys, pairs] = shard_op(args);
  if (sign_flip) frame.bitwise_xor_(static_cast<int64_t>(kSignFlip));
  return frame;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(localargmax, CUDA, m) {
  LOCALARGMAX_IMPL_SHARD_OPS(m, cuda, cuda);
  m.impl("step_frame", &cuda::step_frame_cuda);
}

}  // namespace localargmax
