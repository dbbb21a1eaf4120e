// The CUDA device API the kernels use (threadIdx, __syncthreads, shuffles,
// atomicMax, __ldg, uint4, __half, __nv_bfloat16, ...): the real one under
// nvcc; under a host C++ compiler the SIMT emulation of csrc/emu/simt_emu.h,
// which runs the same kernel text on the CPU (tests/test_emulation.py). The
// kernel headers hold no other compiler switch; the inline PTX sits behind
// functions with a host definition (mma_sync.cuh).
#pragma once

#if defined(__CUDACC__)
#include <cuda.h>  // CUtensorMap (a type only: the encode goes through cudaGetDriverEntryPointByVersion)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include "../emu/simt_emu.h"
#endif

// LAM_EMU_COUNT(kNoiseWords / kNoiseLogs): a counter of the emulation
// (emu::Count); nothing under nvcc.
#if defined(__CUDACC__)
#define LAM_EMU_COUNT(what) ((void)0)
#else
#define LAM_EMU_COUNT(what) ::emu::count(::emu::Count::what)
#endif
