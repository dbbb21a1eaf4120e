// CPU implementation of localargmax::gumbel_noise: the samplers' noise
// (common/philox.h) at any (row, global id), for the filtered sampler's
// re-evaluation on the merged candidates and its fallback rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include "../common/philox.h"
#include "fp_env.h"

namespace localargmax {
namespace cpu {
namespace {

at::Tensor gumbel_noise_cpu(int64_t seed, const at::Tensor& rows_in, const at::Tensor& ids_in) {
  TORCH_CHECK_VALUE(seed >= 0, "gumbel_noise: seed must be >= 0, got ", seed);
  TORCH_CHECK_TYPE(rows_in.scalar_type() == at::kLong && ids_in.scalar_type() == at::kLong,
                   "gumbel_noise: rows and ids must be int64, got ", rows_in.scalar_type(), " and ",
                   ids_in.scalar_type());
  TORCH_CHECK_VALUE(rows_in.device().is_cpu() && ids_in.device().is_cpu(), "gumbel_noise: rows and ids must be ",
                    "on the CPU (this kernel), got ", rows_in.device(), " and ", ids_in.device());
  TORCH_CHECK_VALUE(rows_in.sizes() == ids_in.sizes(), "gumbel_noise: rows ", rows_in.sizes(), " and ids ",
                    ids_in.sizes(), " must have one shape (broadcast them first)");
  const at::Tensor rows = rows_in.contiguous();
  const at::Tensor ids = ids_in.contiguous();
  at::Tensor out = at::empty(rows.sizes(), rows.options().dtype(at::kFloat));
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* v = ids.data_ptr<int64_t>();
  float* g = out.data_ptr<float>();
  std::atomic<bool> negative{false};
  // Each value is a pure function of (seed, row, id): the result does not depend on the split. Rows are
  // uint64 (offset + b, as the kernels form it), carried in int64.
  at::parallel_for(0, out.numel(), 4096, [&](int64_t begin, int64_t end) {
    const KeepDenormals keep_denormals;  // whatever this thread's FTZ / DAZ (fp_env.h)
    for (int64_t i = begin; i < end; ++i) {
      if (v[i] < 0) negative.store(true, std::memory_order_relaxed);
      g[i] = gumbel_noise(static_cast<uint64_t>(seed), static_cast<uint64_t>(r[i]), static_cast<uint64_t>(v[i]));
    }
  });
  TORCH_CHECK_VALUE(!negative.load(), "gumbel_noise: ids must be >= 0 (global vocabulary ids)");
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace localargmax

TORCH_LIBRARY_IMPL(localargmax, CPU, m) { m.impl("gumbel_noise", &localargmax::cpu::gumbel_noise_cpu); }
