// The inline PTX of the tensor-core kernels, each behind a function whose
// host definition is the SIMT emulation's (csrc/emu/simt_emu.h):
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32 (float32
//     accumulators), emulated as a warp-collective product; which element
//     sits in which register: common/mma_fragment.h;
//   cp.async.cg.shared.global (16 bytes, L2 only, zero-filled when invalid),
//     cp.async.commit_group / wait_group: the weight pipeline (sm_80+),
//     emulated as per-thread copy groups whose bytes are "in flight" (any
//     access is an error) until the thread's wait covers them;
//   the dynamic shared memory base (extern __shared__), emulated as a region
//     of the launch's size (an access past it is an error);
//   griddepcontrol.wait / launch_dependents (programmatic dependent launch,
//     sm_90+; no-ops without the launch attribute and below sm_90); emulated:
//     in a programmatic launch a thread that touches a global tensor other
//     than the weight before its wait is an error.
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

// 16 bytes global -> shared, asynchronous (cp.async.cg: cached in L2 only).
// !valid: nothing is read and the 16 shared bytes become zeros.
#if defined(__CUDACC__)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();  // the launcher never picks the pipelined kernel below sm_80
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// Programmatic dependent launch: wait for the grids this one depends on
// (their memory visible), and let the next grid start its prologue.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The block's dynamic shared memory (the size the launch gives), 16-byte
// aligned: extern __shared__ arrays start at the dynamic region's base.
__device__ __forceinline__ uint4* dynamic_shared_memory() {
  extern __shared__ uint4 lam_dynamic_shared[];
  return lam_dynamic_shared;
}
#else
inline uint4* dynamic_shared_memory() { return static_cast<uint4*>(emu::dynamic_shared()); }
inline void cp_async16(void* smem, const void* gmem, bool valid, int line = __builtin_LINE()) {
  uint4 data = make_uint4(0u, 0u, 0u, 0u);
  if (valid) data = *static_cast<const uint4*>(gmem);  // the checked global load
  emu::cp_async(line, smem, data);
}
inline void cp_async_commit(int line = __builtin_LINE()) { emu::cp_async_commit(line); }
template <int N>
inline void cp_async_wait(int line = __builtin_LINE()) {
  emu::cp_async_wait(line, N);
}
inline void grid_dependency_wait(int line = __builtin_LINE()) { emu::grid_dependency_wait(line); }
inline void allow_dependent_launch() {}
#endif

}  // namespace
}  // namespace cuda
}  // namespace localargmax
