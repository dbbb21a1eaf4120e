// The large-batch path ("gemm") of shard_argmax / shard_sample, bf16 / fp16:
// cuBLAS computes float32 logits for a chunk of batch rows (at::mm with
// out_dtype float32: torch's caching allocator, the current stream), then
// logits_to_keys_kernel folds them into the same keys as the fused kernels.
// See shard_paths.h.
#include "shard_launch.cuh"
#include "shard_paths.h"

namespace localargmax {
namespace cuda {

// logits = hidden_chunk @ weight.T in float32 (cuBLAS, tensor cores), then
// logits_to_keys_kernel, which reads columns [0, num_valid) only. The GEMM
// covers all `rows` of the shard, padding included, so that every rank of a
// vocab-parallel layout (equal shard rows, unequal num_valid) runs the same
// GEMM shape: cuBLAS picks its algorithm (tiles, split-K) per shape, and
// identical rows on two ranks must still give identical logits (rules 1 and
// 5). Batch rows go in chunks so that one chunk's logits stay <= 1 GiB (one
// GEMM up to batch 1766 on the full Qwen3 head: each chunk re-reads the weight).
template <typename T>
void run_gemm(const ShardArgmaxProblem<T>& p, const at::Tensor& hidden, const at::Tensor& weight) {
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 30) / 4 / weight.size(0));
  for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
    const int64_t rows = std::min(chunk, p.batch - b0);
    const at::Tensor logits = at::mm(hidden.narrow(0, b0, rows), weight.t(), at::kFloat);
    launch_logits_to_keys(logits.data_ptr<float>(), logits.stride(0), rows, b0, p, CudaLaunch{});
  }
}

template void run_gemm<__half>(const ShardArgmaxProblem<__half>&, const at::Tensor&, const at::Tensor&);
template void run_gemm<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&, const at::Tensor&,
                                      const at::Tensor&);

}  // namespace cuda
}  // namespace localargmax
