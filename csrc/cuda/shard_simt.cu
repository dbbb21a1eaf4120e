// The CUDA-core path ("simt") of the shard ops: every dtype and shape, and the
// only path of shard_topk (fused_keys_simt.cuh; TOPK = true writes each
// block's top-k keys per batch row). See shard_paths.h.
#include "shard_launch.cuh"
#include "shard_paths.h"

namespace localargmax {
namespace cuda {

template <typename T>
void run_simt(const ShardArgmaxProblem<T>& p, bool topk_mode) {
  if (topk_mode) return launch_simt<T, true>(p, CudaLaunch{});
  launch_simt<T, false>(p, CudaLaunch{});
}

template void run_simt<float>(const ShardArgmaxProblem<float>&, bool);
template void run_simt<__half>(const ShardArgmaxProblem<__half>&, bool);
template void run_simt<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&, bool);

}  // namespace cuda
}  // namespace localargmax
