// CPU implementations of localargmax::shard_argmax, shard_topk and
// shard_sample: the fused matmul + reduction, parallel over vocabulary tiles;
// the logits are never materialized.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <tuple>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../checks.h"
#include "../common/philox.h"
#include "../common/step_merge.h"
#include "../impl_shard_ops.h"
#include "cpu_path.h"
#include "fp_env.h"
#include "shard_argmax_brgemm.h"
#include "shard_argmax_tiles.h"

namespace localargmax {
namespace cpu {
namespace {

using TilesFn = void (*)(const ShardArgmaxProblem&, int64_t, int64_t, float*, uint64_t*);

// The tile function of a CPU path name (cpu_path.h: choose_cpu_path on this
// CPU's features and the weight's dtype; "auto" -> brgemm where it runs on
// AMX, else avx512, avx2 or generic, all bit-identical; "avx512_bf16" only
// by name).
struct TilesChoice {
  TilesFn fn;
  bool bf16_pairs;  // avx512_bf16: bfloat16 weights take vdpbf16ps (needs p.hidden_bf16)
  bool brgemm;      // brgemm: p.brgemm_* (prepare_brgemm), a BrgemmChunk per chunk
};

WeightDtype weight_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return WeightDtype::kBFloat16;
    case at::kHalf: return WeightDtype::kFloat16;
    default: return WeightDtype::kFloat32;
  }
}

TilesChoice pick_tiles_fn(const std::string& path, at::ScalarType dtype) {
  const std::string chosen = choose_cpu_path(path, detect_cpu_features(), weight_dtype_of(dtype));
  if (chosen == "brgemm") return {shard_argmax_tiles_brgemm, false, true};
  if (chosen == "avx512_bf16") return {shard_argmax_tiles_avx512_bf16, true, false};
  if (chosen == "avx512") return {shard_argmax_tiles_avx512, false, false};
  if (chosen == "avx2") return {shard_argmax_tiles_avx2, false, false};
  return {shard_argmax_tiles_generic, false, false};
}

// The fused kernel with its reduction policy: keys [B, topk] (see
// ShardArgmaxProblem). Chunks of tiles run in parallel, each into its own
// slot of `partial`; the chunks are then merged per batch row. No dependence
// on thread ids or timing.
// The transform and log-partition request of the *_lse ops (DESIGN.md,
// "Log-probabilities"); `out` receives the [batch, 2] float32 pairs.
struct PartitionRequest {
  float scale;
  float soft_cap;  // 0: none
  at::Tensor* out;
  const at::Tensor* temperature = nullptr;  // [batch] float32 T of the sums (shard_argmax_lse), or nullptr
};

// noise=vllm_noise(...)'s per-row tensors (checked by check_noise_args), or none: the Philox noise.
struct NoiseRows {
  const std::optional<at::Tensor>& seed;
  const std::optional<at::Tensor>& pos;
};

at::Tensor reduce_shard(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        int64_t vocab_start, int64_t num_valid, int64_t topk, const at::Tensor& temperature,
                        uint64_t seed, uint64_t offset, const std::string& path,
                        const PartitionRequest* partition = nullptr, bool brgemm_flag_free = false,
                        const NoiseRows* noise = nullptr) {
  TilesChoice choice = pick_tiles_fn(path, weight.scalar_type());
  // brgemm reads torch.backends.mkldnn.enabled once per call (DESIGN.md, "CPU paths")
  if (choice.brgemm && !brgemm_serves(weight.scalar_type(), brgemm_flag_free))
    choice = pick_tiles_fn("auto", at::kFloat);
  const TilesFn tiles_fn = choice.fn;
  const int64_t batch = hidden.size(0);
  const int64_t hidden_size = hidden.size(1);
  at::Tensor keys = at::zeros({batch, topk}, hidden.options().dtype(at::kLong));
  if (partition != nullptr) {
    // (ref, others) = (-inf, 0): no entry (an empty shard)
    *partition->out = at::empty({batch, 2}, hidden.options().dtype(at::kFloat));
    partition->out->select(1, 0).fill_(-INFINITY);
    partition->out->select(1, 1).fill_(0.0);
  }
  if (batch == 0 || num_valid == 0) return keys;

  const int64_t hidden_pad = (hidden_size + kLanes - 1) / kLanes * kLanes;
  at::Tensor hidden_f32;  // the ISA paths' hidden states (brgemm has its own operands)
  if (!choice.brgemm) {
    hidden_f32 = at::zeros({batch, hidden_pad}, hidden.options().dtype(at::kFloat));
    hidden_f32.narrow(1, 0, hidden_size).copy_(hidden);
  }
  at::Tensor bias_f32;
  if (bias.has_value()) bias_f32 = bias->narrow(0, 0, num_valid).to(at::kFloat).contiguous();
  at::Tensor temperature_f32;
  if (temperature.defined()) temperature_f32 = temperature.to(at::kFloat).contiguous();
  at::Tensor noise_seed, noise_pos;
  if (noise != nullptr && noise->seed.has_value()) {
    noise_seed = noise->seed->contiguous();
    noise_pos = noise->pos->contiguous();
  }

  // avx512_bf16 with bfloat16 weights: the hidden states as zero-padded
  // bfloat16 pairs too (hidden has the weight's dtype: exact).
  at::Tensor hidden_bf16;
  const int64_t hidden_pad_bf16 = (hidden_size + kBf16Pairs - 1) / kBf16Pairs * kBf16Pairs;
  if (choice.bf16_pairs && weight.scalar_type() == at::kBFloat16) {
    hidden_bf16 = at::zeros({batch, hidden_pad_bf16}, hidden.options().dtype(at::kBFloat16));
    hidden_bf16.narrow(1, 0, hidden_size).copy_(hidden);
  }

  ShardArgmaxProblem p;
  p.hidden = hidden_f32.defined() ? hidden_f32.data_ptr<float>() : nullptr;
  p.hidden_bf16 = hidden_bf16.defined() ? static_cast<const uint16_t*>(hidden_bf16.data_ptr()) : nullptr;
  p.hidden_pad_bf16 = hidden_pad_bf16;
  p.weight = weight.data_ptr();
  p.weight_dtype = weight_dtype_of(weight.scalar_type());
  p.ldw = weight.size(0) > 1 ? weight.stride(0) : hidden_size;
  p.bias = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  p.batch = batch;
  p.hidden_size = hidden_size;
  p.hidden_pad = hidden_pad;
  p.num_valid = num_valid;
  p.vocab_start = vocab_start;
  p.topk = topk;
  p.temperature = temperature_f32.defined() ? temperature_f32.data_ptr<float>() : nullptr;
  p.seed = seed;
  p.offset = offset;
  p.noise_seed = noise_seed.defined() ? noise_seed.data_ptr<int64_t>() : nullptr;
  p.noise_pos = noise_pos.defined() ? noise_pos.data_ptr<int64_t>() : nullptr;
  p.scalar_epilogue = scalar_epilogue();
  p.brgemm_hidden = nullptr;
  p.brgemm_weight_tail = nullptr;
  p.brgemm_ldk = 0;
  p.brgemm_n = 0;
  p.brgemm_m = 0;
  p.brgemm_step = 1;
  p.brgemm_lda = 0;
  p.brgemm_vnni = false;
  p.brgemm_recheck = false;
  std::atomic<bool> brgemm_refused{false};
  p.brgemm_refused = &brgemm_refused;
  BrgemmOperands brgemm_operands;
  if (choice.brgemm) brgemm_operands = prepare_brgemm(hidden, weight, num_valid, p, brgemm_flag_free);
  const int64_t num_tiles = (num_valid + kTileRows - 1) / kTileRows;
  std::vector<PartitionState> tile_partition;
  p.partition = nullptr;
  p.partition_temperature = nullptr;
  at::Tensor partition_t;
  p.scale = 1.0f;
  p.soft_cap = 0.0f;
  if (partition != nullptr) {
    tile_partition.assign(static_cast<size_t>(num_tiles * batch), partition_init());
    p.partition = tile_partition.data();
    p.scale = partition->scale;
    p.soft_cap = partition->soft_cap;
    if (partition->temperature != nullptr) {
      partition_t = partition->temperature->contiguous();
      p.partition_temperature = partition_t.data_ptr<float>();
    }
  }

  const int64_t num_chunks = std::min<int64_t>(num_tiles, 4 * static_cast<int64_t>(at::get_num_threads()));
  const int64_t per_chunk = batch * topk;
  std::vector<uint64_t> partial(static_cast<size_t>(num_chunks * per_chunk), 0);
  at::parallel_for(0, num_chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    const KeepDenormals keep_denormals;  // whatever this thread's FTZ / DAZ (fp_env.h)
    const BrgemmChunk brgemm_chunk(choice.brgemm && p.brgemm_vnni);  // releases the tile context, on unwind too
    std::vector<float> scratch(static_cast<size_t>(std::max(4 * hidden_pad + kLanes, kTileRows * kBrgemmMaxBatchBlock)));
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int64_t t0 = c * num_tiles / num_chunks;
      const int64_t t1 = (c + 1) * num_tiles / num_chunks;
      tiles_fn(p, t0, t1, scratch.data(), partial.data() + c * per_chunk);
    }
  });
  if (brgemm_refused.load())  // the oneDNN flag changed during the call: all of it again without oneDNN
    return reduce_shard(hidden, weight, bias, vocab_start, num_valid, topk, temperature, seed, offset, path, partition,
                        true, noise);
  if (partition != nullptr) {
    const KeepDenormals keep_denormals;  // the calling thread's merge too
    // The tiles' pairs, merged in tile order: independent of the chunking.
    float* pairs = partition->out->data_ptr<float>();
    for (int64_t b = 0; b < batch; ++b) {
      const float* tp = p.partition_temperature != nullptr ? p.partition_temperature : p.temperature;
      const float t = tp != nullptr && tp[b] > 0.0f ? tp[b] : 1.0f;
      PartitionState acc = partition_init();
      for (int64_t tile = 0; tile < num_tiles; ++tile) partition_merge(acc, tile_partition[tile * batch + b], t);
      pairs[2 * b] = acc.ref;
      pairs[2 * b + 1] = partition_others(acc);
    }
  }
  auto* out = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  if (topk == 1) {
    for (int64_t c = 0; c < num_chunks; ++c)
      for (int64_t b = 0; b < batch; ++b) out[b] = max_key(out[b], partial[c * per_chunk + b]);
    return keys;
  }
  std::vector<uint64_t> candidates(static_cast<size_t>(num_chunks * topk));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < num_chunks; ++c)
      std::copy_n(partial.data() + c * per_chunk + b * topk, topk, candidates.data() + c * topk);
    std::partial_sort(candidates.begin(), candidates.begin() + topk, candidates.end(), std::greater<uint64_t>());
    std::copy_n(candidates.data(), topk, out + b * topk);
  }
  return keys;
}

at::Tensor shard_argmax_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, int64_t vocab_start,
                            int64_t num_valid, c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  return reduce_shard(hidden, weight, bias, vocab_start, num_valid, 1, at::Tensor(), 0, 0, std::string(path)).view({-1});
}

at::Tensor shard_topk_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          int64_t vocab_start, int64_t num_valid, int64_t k, c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_topk_arg(k);
  return reduce_shard(hidden, weight, bias, vocab_start, num_valid, k, at::Tensor(), 0, 0, std::string(path));
}

// Values are read here, on the host, so that eager and compiled calls refuse
// the same temperatures (the CUDA kernel gives such rows key 0 instead).
void check_temperature_values(const at::Tensor& temperature) {
  const at::Tensor t = temperature.contiguous();
  const float* tp = t.data_ptr<float>();
  for (int64_t b = 0; b < t.numel(); ++b)
    TORCH_CHECK_VALUE(valid_temperature(tp[b]), "shard_sample: temperature must be finite and >= 0 (0 = greedy), got ",
                      tp[b], " at row ", b);
}

at::Tensor shard_sample_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            int64_t vocab_start, int64_t num_valid, const at::Tensor& temperature, int64_t seed,
                            int64_t offset, c10::string_view path, const std::optional<at::Tensor>& noise_seed,
                            const std::optional<at::Tensor>& noise_pos) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_sample_args(hidden, temperature, offset);
  check_noise_args(hidden, noise_seed, noise_pos);
  check_temperature_values(temperature);
  const NoiseRows noise{noise_seed, noise_pos};
  return reduce_shard(hidden, weight, bias, vocab_start, num_valid, 1, temperature, static_cast<uint64_t>(seed),
                      static_cast<uint64_t>(offset), std::string(path), nullptr, false, &noise)
      .view({-1});
}

std::tuple<at::Tensor, at::Tensor> shard_argmax_lse_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                        int64_t num_valid, double scale, double soft_cap,
                                                        c10::string_view path,
                                                        const std::optional<at::Tensor>& temperature) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_transform_args(scale, soft_cap);
  if (temperature.has_value()) check_temperature_arg("shard_argmax", hidden, *temperature);
  at::Tensor pairs;
  const PartitionRequest req{static_cast<float>(scale), static_cast<float>(soft_cap), &pairs,
                             temperature.has_value() ? &*temperature : nullptr};
  at::Tensor keys =
      reduce_shard(hidden, weight, bias, vocab_start, num_valid, 1, at::Tensor(), 0, 0, std::string(path), &req);
  return {keys.view({-1}), pairs};
}

std::tuple<at::Tensor, at::Tensor> shard_topk_lse_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                                      const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                      int64_t num_valid, int64_t k, double scale, double soft_cap,
                                                      c10::string_view path) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_topk_arg(k);
  check_transform_args(scale, soft_cap);
  at::Tensor pairs;
  const PartitionRequest req{static_cast<float>(scale), static_cast<float>(soft_cap), &pairs};
  at::Tensor keys =
      reduce_shard(hidden, weight, bias, vocab_start, num_valid, k, at::Tensor(), 0, 0, std::string(path), &req);
  return {keys, pairs};
}

std::tuple<at::Tensor, at::Tensor> shard_sample_lse_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias, int64_t vocab_start,
                                                        int64_t num_valid, const at::Tensor& temperature,
                                                        int64_t seed, int64_t offset, double scale, double soft_cap,
                                                        c10::string_view path,
                                                        const std::optional<at::Tensor>& noise_seed,
                                                        const std::optional<at::Tensor>& noise_pos) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  check_sample_args(hidden, temperature, offset);
  check_noise_args(hidden, noise_seed, noise_pos);
  check_transform_args(scale, soft_cap);
  check_temperature_values(temperature);
  at::Tensor pairs;
  const PartitionRequest req{static_cast<float>(scale), static_cast<float>(soft_cap), &pairs};
  const NoiseRows noise{noise_seed, noise_pos};
  at::Tensor keys = reduce_shard(hidden, weight, bias, vocab_start, num_valid, 1, temperature,
                                 static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), std::string(path), &req,
                                 false, &noise);
  return {keys.view({-1}), pairs};
}

// localargmax::step_frame on the CPU: the rank's fused op, then its frame
// (common/step_merge.h's layout): [size, -size, vocab_end], the keys, the
// pairs' words with send_pairs; every word XOR the sign bit with sign_flip.
at::Tensor step_frame_cpu(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          int64_t vocab_start, int64_t num_valid, int64_t mode, int64_t k,
                          const std::optional<at::Tensor>& temperature, int64_t seed, int64_t offset, double scale,
                          double soft_cap, bool log_partition, bool send_pairs, bool sign_flip, c10::string_view path,
                          const std::optional<at::Tensor>& noise_seed, const std::optional<at::Tensor>& noise_pos) {
  check_step_frame_args(mode, k, temperature, log_partition, send_pairs, sign_flip);
  at::Tensor keys, pairs;
  if (mode == kStepTopk) {
    if (log_partition)
      std::tie(keys, pairs) = shard_topk_lse_cpu(hidden, weight, bias, vocab_start, num_valid, k, scale, soft_cap, path);
    else
      keys = shard_topk_cpu(hidden, weight, bias, vocab_start, num_valid, k, path);
  } else if (mode == kStepSample) {
    if (log_partition)
      std::tie(keys, pairs) = shard_sample_lse_cpu(hidden, weight, bias, vocab_start, num_valid, *temperature, seed,
                                                   offset, scale, soft_cap, path, noise_seed, noise_pos);
    else
      keys = shard_sample_cpu(hidden, weight, bias, vocab_start, num_valid, *temperature, seed, offset, path,
                              noise_seed, noise_pos);
  } else if (log_partition) {
    std::tie(keys, pairs) =
        shard_argmax_lse_cpu(hidden, weight, bias, vocab_start, num_valid, scale, soft_cap, path, temperature);
  } else {
    keys = shard_argmax_cpu(hidden, weight, bias, vocab_start, num_valid, path);
  }
  const int64_t batch = hidden.size(0), n = keys.numel();
  at::Tensor frame = at::empty({kFrameHeader + n + (send_pairs ? batch : 0)}, keys.options());
  int64_t* w = frame.data_ptr<int64_t>();
  const int64_t size = n + 1 + (send_pairs ? kPairsFlag : 0);
  w[0] = size;
  w[1] = -size;
  w[2] = num_valid ? vocab_start + num_valid : 0;
  if (n) std::memcpy(w + kFrameHeader, keys.contiguous().data_ptr<int64_t>(), n * sizeof(int64_t));
  if (send_pairs && batch) std::memcpy(w + kFrameHeader + n, pairs.contiguous().data_ptr<float>(), batch * 8);
  if (sign_flip)
    for (int64_t i = 0; i < frame.numel(); ++i) w[i] ^= static_cast<int64_t>(kSignFlip);
  return frame;
}

}  // namespace

// How many distinct OS threads run the bodies of at::parallel_for(0, n, 1,
// ...) in this file: the number of workers reduce_shard gets. It is 1 whatever
// torch.get_num_threads() says when this file was compiled without OpenMP
// (at::parallel_for then runs serially; see CMakeLists.txt). Tested by
// tests/test_cpu_parallel.py.
int64_t parallel_workers(int64_t n) {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(seen.size());
}

namespace {
std::atomic<bool> g_scalar_epilogue{false};
}  // namespace
void set_scalar_epilogue(bool on) { g_scalar_epilogue.store(on); }
bool scalar_epilogue() { return g_scalar_epilogue.load(); }

}  // namespace cpu

TORCH_LIBRARY_IMPL(localargmax, CPU, m) {
  LOCALARGMAX_IMPL_SHARD_OPS(m, cpu, cpu);
  m.impl("step_frame", &cpu::step_frame_cpu);
}

}  // namespace localargmax
