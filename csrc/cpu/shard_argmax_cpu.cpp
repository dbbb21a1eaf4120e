// CPU implementation of localargmax::shard_argmax: the fused matmul + argmax,
// parallel over vocabulary tiles; the logits are never materialized.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../checks.h"
#include "shard_argmax_tiles.h"

namespace localargmax {
namespace cpu {
namespace {

using TilesFn = void (*)(const ShardArgmaxProblem&, int64_t, int64_t, float*, uint64_t*);

// AVX2 + FMA + F16C when the CPU has them, unless LOCALARGMAX_CPU_ISA=generic.
// Both variants give bit-identical keys (see shard_argmax_tiles.h).
TilesFn pick_tiles_fn() {
  const char* isa = std::getenv("LOCALARGMAX_CPU_ISA");
  if (isa != nullptr && std::strcmp(isa, "generic") == 0) return shard_argmax_tiles_generic;
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return shard_argmax_tiles_avx2;
#endif
  return shard_argmax_tiles_generic;
}

WeightDtype weight_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return WeightDtype::kBFloat16;
    case at::kHalf: return WeightDtype::kFloat16;
    default: return WeightDtype::kFloat32;
  }
}

at::Tensor shard_argmax_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, int64_t vocab_start,
                            int64_t num_valid) {
  check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid);
  const int64_t batch = hidden.size(0);
  const int64_t hidden_size = hidden.size(1);
  at::Tensor keys = at::zeros({batch}, hidden.options().dtype(at::kLong));
  if (batch == 0 || num_valid == 0) return keys;

  const int64_t hidden_pad = (hidden_size + kLanes - 1) / kLanes * kLanes;
  at::Tensor hidden_f32 = at::zeros({batch, hidden_pad}, hidden.options().dtype(at::kFloat));
  hidden_f32.narrow(1, 0, hidden_size).copy_(hidden);
  at::Tensor bias_f32;
  if (bias.has_value()) bias_f32 = bias->narrow(0, 0, num_valid).to(at::kFloat).contiguous();

  ShardArgmaxProblem p;
  p.hidden = hidden_f32.data_ptr<float>();
  p.weight = weight.data_ptr();
  p.weight_dtype = weight_dtype_of(weight.scalar_type());
  p.ldw = weight.size(0) > 1 ? weight.stride(0) : hidden_size;
  p.bias = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  p.batch = batch;
  p.hidden_size = hidden_size;
  p.hidden_pad = hidden_pad;
  p.num_valid = num_valid;
  p.vocab_start = vocab_start;

  // Fixed chunks of tiles, each reduced into its own row of `partial`, then
  // an unsigned max over chunks: no dependence on thread ids or timing.
  const int64_t num_tiles = (num_valid + kTileRows - 1) / kTileRows;
  const int64_t num_chunks = std::min<int64_t>(num_tiles, 4 * static_cast<int64_t>(at::get_num_threads()));
  std::vector<uint64_t> partial(static_cast<size_t>(num_chunks * batch), 0);
  const TilesFn tiles_fn = pick_tiles_fn();
  at::parallel_for(0, num_chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    std::vector<float> scratch(static_cast<size_t>(4 * hidden_pad + kLanes));
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int64_t t0 = c * num_tiles / num_chunks;
      const int64_t t1 = (c + 1) * num_tiles / num_chunks;
      tiles_fn(p, t0, t1, scratch.data(), partial.data() + c * batch);
    }
  });
  auto* out = reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>());
  for (int64_t c = 0; c < num_chunks; ++c)
    for (int64_t b = 0; b < batch; ++b) out[b] = max_key(out[b], partial[c * batch + b]);
  return keys;
}

}  // namespace
}  // namespace cpu

TORCH_LIBRARY_IMPL(localargmax, CPU, m) { m.impl("shard_argmax", &cpu::shard_argmax_cpu); }

}  // namespace localargmax
