// LAM_HD marks a function that the CPU kernel, the CUDA kernels, the host
// emulation of the CUDA kernels (csrc/emu/) and the C++ unit tests all compile.
// static: every translation unit gets its own copy, so the CPU kernel's ISA
// variants (compiled with different -m flags) can never share one.
#pragma once

#if defined(__CUDACC__)
#define LAM_HD static __host__ __device__ __forceinline__
#else
#define LAM_HD static inline
#endif
