// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32 (float32 accumulators)
// for the tensor-core kernel: the inline PTX on sm_80+, the host SIMT
// emulation's warp-collective product (csrc/emu/simt_emu.h) under a host
// compiler. Which element sits in which register: common/mma_fragment.h.
#pragma once

#include "device_runtime.cuh"

namespace localargmax {
namespace cuda {
namespace {

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                          unsigned int a3, unsigned int b0, unsigned int b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], unsigned int a0, unsigned int a1,
                                                         unsigned int a2, unsigned int a3, unsigned int b0,
                                                         unsigned int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDACC__)
  __trap();  // the launcher never picks this kernel below sm_80
#else
  emu::mma_m16n8k16(emu::MmaInput::kBFloat16, c, a0, a1, a2, a3, b0, b1);
#endif
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                                  unsigned int a3, unsigned int b0, unsigned int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDACC__)
  __trap();
#else
  emu::mma_m16n8k16(emu::MmaInput::kFloat16, c, a0, a1, a2, a3, b0, b1);
#endif
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax
