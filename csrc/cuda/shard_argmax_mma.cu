// The tensor-core path ("mma") of shard_argmax / shard_sample, bf16 / fp16 on
// sm_80+ (shard_argmax_mma_kernel.cuh). See shard_argmax_paths.h.
//
// launch_mma (shard_argmax_launch.cuh) runs the variant the op's path names
// ("mma/<id>"), else picks one from the shared arguments and the device's SM
// count. On sm_90+ the pipelined variants are
// launched with programmatic stream serialization (PDL): they issue their
// first weight stages, then griddepcontrol.wait before they read anything an
// earlier kernel writes (hidden, bias, temperature, keys), so the weight
// streams while the kernel before them (the keys' zero fill, or the copy of a
// misaligned hidden) drains. The register-double-buffered variants do not
// wait, so they are launched plainly.
#include <cstring>

#include "shard_argmax_launch.cuh"
#include "shard_argmax_paths.h"

namespace localargmax {
namespace cuda {
namespace {

struct MmaLaunch {
  bool pdl;  // sm_90+
  template <typename... P, typename... Args>
  void operator()(const char* family, void (*kernel)(P...), dim3 grid, dim3 block, const Args&... args) const {
    if (!pdl || std::strcmp(family, kMmaPipeFamily) != 0) return CudaLaunch{}(family, kernel, grid, block, args...);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = 0;
    config.stream = c10::cuda::getCurrentCUDAStream();
    config.attrs = attr;
    config.numAttrs = 1;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<P>(args)...));
  }
};

}  // namespace

template <typename T>
void run_mma(const ShardArgmaxProblem<T>& p, int variant) {
  int device = 0, sms = 0, major = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  launch_mma(p, MmaLaunch{major >= 9}, kMaxGridY, sms, variant);
}

template void run_mma<__half>(const ShardArgmaxProblem<__half>&, int);
template void run_mma<__nv_bfloat16>(const ShardArgmaxProblem<__nv_bfloat16>&, int);

}  // namespace cuda
}  // namespace localargmax
