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
//     than the weight before its wait is an error;
//   the bulk tensor copy (TMA, sm_90+): cp.async.bulk.tensor.2d ... mbarrier::
//     complete_tx::bytes of one box of a tensor map (WeightTensorMap: the
//     driver's CUtensorMap, encoded on the host) into shared memory, completing
//     on an mbarrier (mbarrier.init / arrive.expect_tx / try_wait.parity),
//     fence.mbarrier_init and fence.proxy.async; emulated: the box lands at
//     issue (zero fill out of bounds, the global reads checked), but no thread
//     may touch its bytes before it has observed the completion of the
//     mbarrier phase the copy completes, a copy into bytes that the generic
//     proxy accessed needs the issuing thread's fence.proxy.async after the
//     last barrier, and every copy's phase must be observed before the block
//     exits. Below sm_90 these trap (the launcher never runs a TMA variant there).
#pragma once

#include <type_traits>

#include "device_runtime.cuh"

namespace localargmax {
namespace cuda {
namespace {

// c += a * b for one m16n8k16 tile of T = __nv_bfloat16 or __half (float32
// accumulators; the fragments' layout: common/mma_fragment.h).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                          unsigned int a3, unsigned int b0, unsigned int b1) {
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LAM_MMA(TYPE)                                                                                \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                                \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                         \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                      \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
  if constexpr (bf16) {
    LAM_MMA("bf16");
  } else {
    LAM_MMA("f16");
  }
#undef LAM_MMA
#elif defined(__CUDACC__)
  __trap();  // the launcher never picks this kernel below sm_80
#else
  emu::mma_m16n8k16(bf16 ? emu::MmaInput::kBFloat16 : emu::MmaInput::kFloat16, c, a0, a1, a2, a3, b0, b1);
#endif
}

#if defined(__CUDACC__)
// LAM_SM80(stmt) / LAM_SM90(stmt): stmt in code for sm_80+ / sm_90+, nothing
// below; the _OR_TRAP forms trap below instead (the launcher never runs a
// kernel that needs them there: the pipelined kernel below sm_80, the TMA
// configs below sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LAM_SM80(...) __VA_ARGS__
#define LAM_SM80_OR_TRAP(...) __VA_ARGS__
#else
#define LAM_SM80(...)
#define LAM_SM80_OR_TRAP(...) __trap()
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LAM_SM90(...) __VA_ARGS__
#define LAM_SM90_OR_TRAP(...) __VA_ARGS__
#else
#define LAM_SM90(...)
#define LAM_SM90_OR_TRAP(...) __trap()
#endif
// The 32-bit shared-window address of a generic pointer into shared memory:
// what cp.async, mbarrier and the bulk tensor copy name as their shared operand.
__device__ __forceinline__ unsigned int shared_address(const void* p) {
  return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronous (cp.async.cg: cached in L2 only).
// !valid: nothing is read and the 16 shared bytes become zeros.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  LAM_SM80_OR_TRAP(asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)),
                                "l"(gmem), "r"(valid ? 16 : 0)
                                : "memory"));
}
__device__ __forceinline__ void cp_async_commit() { LAM_SM80(asm volatile("cp.async.commit_group;\n" ::: "memory")); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  LAM_SM80(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}
// Programmatic dependent launch: wait for the grids this one depends on
// (their memory visible), and let the next grid start its prologue.
__device__ __forceinline__ void grid_dependency_wait() { LAM_SM90(asm volatile("griddepcontrol.wait;\n" ::: "memory")); }
__device__ __forceinline__ void allow_dependent_launch() {
  LAM_SM90(asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"));
}
// The block's dynamic shared memory (the size the launch gives), 128-byte
// aligned (a bulk tensor copy's destination must be; the pipe kernels'
// static block_best sizes are multiples of 128 bytes, so the alignment moves
// nothing): extern __shared__ arrays start at the dynamic region's base.
__device__ __forceinline__ uint4* dynamic_shared_memory() {
  extern __shared__ __align__(128) uint4 lam_dynamic_shared[];
  return lam_dynamic_shared;
}

// The bulk tensor copy (TMA) of the weight tiles (sm_90+). A CUtensorMap is
// passed as a const __grid_constant__ kernel parameter; its generic address is
// what the copy names (PTX ISA, "Tensor-map": a tensor map in the .param space
// of a kernel, accessed through its generic address).
using WeightTensorMap = CUtensorMap;
// mbarrier.init: `count` arrivals complete a phase (with the pending
// transaction bytes at zero).
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned int count) {
  LAM_SM90_OR_TRAP(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count)
                                : "memory"));
}
// Makes the mbarrier inits visible to the asynchronous proxy (the bulk copies'
// complete_tx) before any copy names them (PTX ISA, "membar / fence":
// fence.mbarrier_init); a __syncthreads after it makes them visible to the
// block's threads.
__device__ __forceinline__ void mbarrier_init_fence() {
  LAM_SM90(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
// One arrival that also adds `bytes` to the phase's expected transaction count.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned int bytes) {
  LAM_SM90_OR_TRAP(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
                                "r"(bytes)
                                : "memory"));
}
// Waits until the phase of parity `parity` has completed (try_wait.parity in a
// loop; its acquire makes the bulk copies' writes of that phase visible).
__device__ __forceinline__ void mbarrier_wait_parity(unsigned long long* bar, unsigned int parity) {
  unsigned int done = 0;
  while (!done) {
    LAM_SM90_OR_TRAP(
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
                     "p;\n}\n"
                     : "=r"(done)
                     : "r"(shared_address(bar)), "r"(parity)
                     : "memory"));
  }
}
// Orders this thread's (and, after a barrier, the block's) generic-proxy
// accesses of shared memory before later async-proxy ones (a bulk copy into
// the same bytes): PTX ISA, "Memory Consistency Model" / "Proxies" and
// "membar / fence" (fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_shared() {
  LAM_SM90_OR_TRAP(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}
// The box of `map` at coordinates (x innermost, y) into shared memory at
// `smem` (128-byte aligned), out-of-bounds elements zero, completing its
// bytes on the mbarrier `bar` (complete_tx).
__device__ __forceinline__ void tma_load_2d(void* smem, const WeightTensorMap* map, int x, int y,
                                            unsigned long long* bar) {
  LAM_SM90_OR_TRAP(asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
                                "[%1, {%2, %3}], [%4];\n" ::"r"(shared_address(smem)),
                                "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y),
                                "r"(shared_address(bar))
                                : "memory"));
}
#undef LAM_SM80
#undef LAM_SM80_OR_TRAP
#undef LAM_SM90
#undef LAM_SM90_OR_TRAP
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
using WeightTensorMap = emu::TensorMap2d;
inline void mbarrier_init(unsigned long long* bar, unsigned int count, int line = __builtin_LINE()) {
  emu::mbarrier_init(line, bar, count);
}
inline void mbarrier_init_fence() {}
inline void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned int bytes, int line = __builtin_LINE()) {
  emu::mbarrier_arrive_expect_tx(line, bar, bytes);
}
inline void mbarrier_wait_parity(unsigned long long* bar, unsigned int parity, int line = __builtin_LINE()) {
  emu::mbarrier_wait_parity(line, bar, parity);
}
inline void fence_proxy_async_shared(int line = __builtin_LINE()) { emu::fence_proxy_async(line); }
inline void tma_load_2d(void* smem, const WeightTensorMap* map, int x, int y, unsigned long long* bar,
                        int line = __builtin_LINE()) {
  emu::tma_load_2d(line, smem, *map, x, y, bar);
}
#endif

}  // namespace
}  // namespace cuda
}  // namespace localargmax
