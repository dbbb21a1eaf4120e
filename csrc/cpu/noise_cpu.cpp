// CPU implementations of the noise ops: localargmax::gumbel_noise, the
// samplers' Philox noise (common/philox.h) at any (row, global id), for the
// filtered sampler's re-evaluation on the merged candidates and its fallback
// rows; and localargmax::vllm_gumbel_noise, vLLM 0.34's noise
// (common/vllm_noise.h, the kernels' own functions) at any (seed, pos,
// global id): localargmax.vllm_gumbel_noise on the CPU (the tests'
// reference and the noise anywhere outside the kernels).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <initializer_list>
#include <utility>

#include "../common/philox.h"
#include "../common/vllm_noise.h"
#include "fp_env.h"

namespace localargmax {
namespace cpu {
namespace {

using NamedTensor = std::pair<const char*, const at::Tensor*>;

// Every argument int64 (TypeError), on the CPU and of ids' shape (ValueError).
void check_index_args(const char* op, std::initializer_list<NamedTensor> args, const at::Tensor& ids) {
  for (const auto& [name, t] : args) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", t->scalar_type());
    TORCH_CHECK_VALUE(t->device().is_cpu(), op, ": ", name, " must be on the CPU (this kernel), got ", t->device());
    TORCH_CHECK_VALUE(t->sizes() == ids.sizes(), op, ": ", name, " ", t->sizes(), " and ids ", ids.sizes(),
                      " must have one shape (broadcast them first)");
  }
}

// noise(i) for i < n, in parallel under the kernels' denormal mode; each value
// is a pure function of its element's inputs, so the result does not depend
// on the split. ids (global vocabulary ids) must be >= 0.
template <typename Noise>
void fill_noise(const char* op, int64_t n, const int64_t* ids, const Noise& noise) {
  std::atomic<bool> negative{false};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    const KeepDenormals keep_denormals;  // whatever this thread's FTZ / DAZ (fp_env.h)
    for (int64_t i = begin; i < end; ++i) {
      if (ids[i] < 0) negative.store(true, std::memory_order_relaxed);
      noise(i);
    }
  });
  TORCH_CHECK_VALUE(!negative.load(), op, ": ids must be >= 0 (global vocabulary ids)");
}

at::Tensor gumbel_noise_cpu(int64_t seed, const at::Tensor& rows_in, const at::Tensor& ids_in) {
  TORCH_CHECK_VALUE(seed >= 0, "gumbel_noise: seed must be >= 0, got ", seed);
  check_index_args("gumbel_noise", {{"rows", &rows_in}, {"ids", &ids_in}}, ids_in);
  const at::Tensor rows = rows_in.contiguous();
  const at::Tensor ids = ids_in.contiguous();
  at::Tensor out = at::empty(ids.sizes(), ids.options().dtype(at::kFloat));
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* v = ids.data_ptr<int64_t>();
  float* g = out.data_ptr<float>();
  // Rows are uint64 (offset + b, as the kernels form it), carried in int64.
  fill_noise("gumbel_noise", out.numel(), v, [&](int64_t i) {
    g[i] = gumbel_noise(static_cast<uint64_t>(seed), static_cast<uint64_t>(r[i]), static_cast<uint64_t>(v[i]));
  });
  return out;
}

at::Tensor vllm_gumbel_noise_cpu(const at::Tensor& seeds_in, const at::Tensor& pos_in, const at::Tensor& ids_in,
                                 bool fp64) {
  check_index_args("vllm_gumbel_noise", {{"seeds", &seeds_in}, {"pos", &pos_in}, {"ids", &ids_in}}, ids_in);
  const at::Tensor seeds = seeds_in.contiguous();
  const at::Tensor pos = pos_in.contiguous();
  const at::Tensor ids = ids_in.contiguous();
  at::Tensor out = at::empty(ids.sizes(), ids.options().dtype(fp64 ? at::kDouble : at::kFloat));
  const int64_t* s = seeds.data_ptr<int64_t>();
  const int64_t* q = pos.data_ptr<int64_t>();
  const int64_t* v = ids.data_ptr<int64_t>();
  double* g64 = fp64 ? out.data_ptr<double>() : nullptr;
  float* g32 = fp64 ? nullptr : out.data_ptr<float>();
  fill_noise("vllm_gumbel_noise", out.numel(), v, [&](int64_t i) {
    const auto seed = static_cast<uint64_t>(s[i]), p = static_cast<uint64_t>(q[i]), id = static_cast<uint64_t>(v[i]);
    if (fp64)
      g64[i] = vllm_gumbel_noise64(seed, p, id);
    else
      g32[i] = vllm_gumbel_noise(seed, p, id);
  });
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace localargmax

TORCH_LIBRARY_IMPL(localargmax, CPU, m) {
  m.impl("gumbel_noise", &localargmax::cpu::gumbel_noise_cpu);
  m.impl("vllm_gumbel_noise", &localargmax::cpu::vllm_gumbel_noise_cpu);
}
