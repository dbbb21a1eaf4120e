// The CUDA paths of the shard ops, one translation unit each so that ninja
// compiles them in parallel (in one file they took 272 s to compile for three
// architectures on 2 cores; split, the longest file takes under half that):
//   shard_simt.cu  run_simt  the CUDA-core kernel (fused_keys_simt.cuh)
//   shard_mma.cu   run_mma   the tensor-core kernel (fused_keys_mma.cuh; bf16 / fp16)
//   shard_mma_topk.cu  run_mma_topk  its top-k kernel
//   shard_gemm.cu  run_gemm  cuBLAS logits + logits_to_keys (bf16 / fp16)
// Each takes argmax, sample and top-k (where it serves them) and the
// log-partition alike (ShardReduce says which). shard_ops_cuda.cu holds the
// ops' entry points (one shard_op for all six) and picks the path; each
// run_* picks the instantiation and grid through shard_launch.cuh and
// launches on the current stream. Each file instantiates its template for the
// dtypes it serves (T = float, __half, __nv_bfloat16).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include "fused_keys_simt.cuh"

namespace localargmax {
namespace cuda {

template <typename T>
void run_simt(const ShardArgmaxProblem<T>& p, bool topk_mode);
// config: a row of kMmaConfigs (mma_configs.h), or -1 for launch_mma's own
// choice. Returns the grid's blocks along x (the rows of the log-partition states).
template <typename T>
int64_t run_mma(const ShardArgmaxProblem<T>& p, int config);
template <typename T>
int64_t run_mma_topk(const ShardArgmaxProblem<T>& p, int config);
template <typename T>
void run_gemm(const ShardArgmaxProblem<T>& p, const at::Tensor& hidden, const at::Tensor& weight);

// Starts kernel<<<grid, block>>>(args...) on the current stream (the launch
// functor that shard_launch.cuh's launchers call).
struct CudaLaunch {
  template <typename Kernel, typename... Args>
  void operator()(const char*, Kernel kernel, dim3 grid, dim3 block, const Args&... args) const {
    kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace cuda
}  // namespace localargmax
