// The tensor-core path of argmax / sample and their log-partition twins
// (shard_mma.h; top-k: shard_mma_topk.cu). See shard_paths.h.
#include "shard_mma.h"

namespace localargmax {
namespace cuda {

template <typename T>
int64_t run_mma(const ShardArgmaxProblem<T>& p, int config) {
  return run_mma_path<false>(p, config);
}

template int64_t run_mma<__half>(const ShardArgmaxProblem<__half>&, int);
template int64_t run_mma<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&, int);

}  // namespace cuda
}  // namespace localargmax
