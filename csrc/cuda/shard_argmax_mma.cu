// The tensor-core path ("mma") of shard_argmax / shard_sample, bf16 / fp16 on
// sm_80+ (shard_argmax_mma_kernel.cuh). See shard_argmax_paths.h.
#include "shard_argmax_launch.cuh"
#include "shard_argmax_paths.h"

namespace localargmax {
namespace cuda {

template <typename T>
void run_mma(const ShardArgmaxProblem<T>& p) {
  launch_mma(p, CudaLaunch{});
}

template void run_mma<__half>(const ShardArgmaxProblem<__half>&);
template void run_mma<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&);

}  // namespace cuda
}  // namespace localargmax
