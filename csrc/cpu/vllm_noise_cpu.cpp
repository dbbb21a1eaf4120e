// CPU implementation of localargmax::vllm_gumbel_noise: vLLM 0.34's Gumbel
// noise (common/vllm_noise.h, the kernels' own functions) at any (seed, pos,
// global id): localargmax.vllm_gumbel_noise on the CPU (the tests' reference
// and the noise anywhere outside the kernels).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <utility>

#include "../common/vllm_noise.h"
#include "fp_env.h"

namespace localargmax {
namespace cpu {
namespace {

at::Tensor vllm_gumbel_noise_cpu(const at::Tensor& seeds_in, const at::Tensor& pos_in, const at::Tensor& ids_in,
                                 bool fp64) {
  const std::pair<const char*, const at::Tensor*> args[] = {{"seeds", &seeds_in}, {"pos", &pos_in}, {"ids", &ids_in}};
  for (const auto& [name, t] : args) {
    TORCH_CHECK_VALUE(t->scalar_type() == at::kLong, "vllm_gumbel_noise: ", name, " must be int64, got ",
                      t->scalar_type());
    TORCH_CHECK_VALUE(t->device().is_cpu(), "vllm_gumbel_noise: ", name, " must be on the CPU (this kernel), got ",
                      t->device());
    TORCH_CHECK_VALUE(t->sizes() == ids_in.sizes(), "vllm_gumbel_noise: ", name, " ", t->sizes(), " and ids ",
                      ids_in.sizes(), " must have one shape (broadcast them first)");
  }
  const at::Tensor seeds = seeds_in.contiguous();
  const at::Tensor pos = pos_in.contiguous();
  const at::Tensor ids = ids_in.contiguous();
  at::Tensor out = at::empty(ids.sizes(), ids.options().dtype(fp64 ? at::kDouble : at::kFloat));
  const int64_t* s = seeds.data_ptr<int64_t>();
  const int64_t* q = pos.data_ptr<int64_t>();
  const int64_t* v = ids.data_ptr<int64_t>();
  double* g64 = fp64 ? out.data_ptr<double>() : nullptr;
  float* g32 = fp64 ? nullptr : out.data_ptr<float>();
  std::atomic<bool> negative{false};
  // Each value is a pure function of (seed, pos, id): the result does not depend on the split.
  at::parallel_for(0, out.numel(), 4096, [&](int64_t begin, int64_t end) {
    const KeepDenormals keep_denormals;  // whatever this thread's FTZ / DAZ (fp_env.h)
    for (int64_t i = begin; i < end; ++i) {
      if (v[i] < 0) negative.store(true, std::memory_order_relaxed);
      const auto seed = static_cast<uint64_t>(s[i]), p = static_cast<uint64_t>(q[i]), id = static_cast<uint64_t>(v[i]);
      if (fp64)
        g64[i] = vllm_gumbel_noise64(seed, p, id);
      else
        g32[i] = vllm_gumbel_noise(seed, p, id);
    }
  });
  TORCH_CHECK_VALUE(!negative.load(), "vllm_gumbel_noise: ids must be >= 0 (global vocabulary ids)");
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace localargmax

TORCH_LIBRARY_IMPL(localargmax, CPU, m) { m.impl("vllm_gumbel_noise", &localargmax::cpu::vllm_gumbel_noise_cpu); }
