// The tensor-core path of top-k and its log-partition twin
// (shard_mma.h; the top-k kernels alone, built beside shard_mma.cu's). See
// shard_paths.h.
#include "shard_mma.h"

namespace localargmax {
namespace cuda {

template <typename T>
int64_t run_mma_topk(const ShardArgmaxProblem<T>& p, int config) {
  return run_mma_path<true>(p, config);
}

template int64_t run_mma_topk<__half>(const ShardArgmaxProblem<__half>&, int);
template int64_t run_mma_topk<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&, int);

}  // namespace cuda
}  // namespace localargmax
