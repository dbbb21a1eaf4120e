// Host SIMT emulation of the CUDA device API the kernels use, so that the
// unmodified kernel headers (csrc/cuda/*.cuh, through device_runtime.cuh)
// compile with a host C++ compiler and run on the CPU: one fiber per CUDA
// thread, every thread of a block live at once, __syncthreads as a block
// barrier, shuffles and mma.sync as warp collectives (all lanes named by the
// mask must arrive at the same call), 64-bit atomicMax, 16-byte __ldg/__ldcs,
// cp.async (16-byte global -> shared copies with commit / wait groups per
// thread; the shared bytes stay "in flight" until the issuing thread's
// cp.async.wait_group covers them: any access before that is an error, and
// the copy lands as a write by the issuing thread at its wait, so a reader in
// another thread needs a __syncthreads after it), mbarriers and the 2-D bulk
// tensor copy (TMA) that completes on them (the box lands at issue, but a
// thread may touch its bytes only after it has observed the completion of the
// mbarrier phase the copy completes: the phase is the synchronisation that
// makes the copy's writes visible).
//
// Checked memory (csrc/emu/simt_emu.cpp): the kernel translation unit is built
// with -fsanitize=thread instrumentation whose hooks are ours: every global
// load / store is checked against the extent of the tensor it falls next to,
// shared memory (the __shared__ statics, moved into section lam_emu_shared,
// and the dynamic shared memory of the launch's size) is poisoned before each
// block and every shared access is checked for a read
// of never-written data and for a race (another thread wrote / read the bytes
// since the last barrier). A failure aborts the launch with the kernel, block,
// thread, source line and offset. Driven by tests/test_emulation.py.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
// Function-local statics of the kernel translation unit; the build moves its
// .bss (nothing else lives there) into section lam_emu_shared.
#define __shared__ static

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

struct __half {
  unsigned short __x;
};
struct __nv_bfloat16 {
  unsigned short __x;
};

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __bfloat162float(__nv_bfloat16 x) { return __uint_as_float(static_cast<unsigned int>(x.__x) << 16); }
inline float __half2float(__half h) {
  const unsigned int sign = (h.__x & 0x8000u) << 16, exp = (h.__x >> 10) & 0x1Fu, man = h.__x & 0x3FFu;
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
  const float m = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal: exact
  return sign ? -m : m;
}
// IEEE round-to-nearest float32 operations (the emulation is built with
// -ffp-contract=off, so nothing is fused behind them).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

struct Thread {
  uint3 thread_idx;  // threadIdx
  int tid;           // linear thread index in the block
};
struct Launch {
  uint3 block_idx;   // blockIdx of the running block
  dim3 block_dim;
  dim3 grid_dim;
};
extern Thread* g_thread;  // the running CUDA thread
extern Launch g_launch;

[[noreturn]] void fail(int line, const char* what);
void syncthreads(int line);
// __syncthreads_and: the barrier, returning 1 on every thread when every
// thread's predicate was nonzero, else 0.
int syncthreads_and(int line, int predicate);
// Warp collective: every lane in `mask` deposits `value`, gets src_lane's value.
uint64_t shfl(int line, unsigned int mask, uint64_t value, int src_lane);

// Counters of the sampling noise screen (LAM_EMU_COUNT, device_runtime.cuh):
// kNoiseWords, logits whose Philox word was drawn; kNoiseLogs, logits that
// took gumbel_of_word's double logs. Read through lam_emu_stats.
enum class Count { kNoiseWords, kNoiseLogs };
void count(Count what);

enum class MmaInput { kBFloat16, kFloat16 };
void mma_m16n8k16(MmaInput input, float (&c)[4], unsigned int a0, unsigned int a1, unsigned int a2, unsigned int a3,
                  unsigned int b0, unsigned int b1, int line = __builtin_LINE());

// cp.async (mma_sync.cuh): `data` was read from global memory at issue (in
// the instrumented kernel translation unit, so bounds-checked there, or zeros
// for a zero-filled copy); it lands in shared memory at the wait that covers
// its group.
void cp_async(int line, void* smem_dst, const uint4& data);
void cp_async_commit(int line);
void cp_async_wait(int line, int pending);
// The base of the block's dynamic shared memory (extern __shared__): a region
// of the size the launch gives (emu::launch); an access past it is an error.
void* dynamic_shared();
// griddepcontrol.wait: in a launch marked programmatic (set_programmatic_launch),
// a thread may touch no global tensor but the one named "weight" before it.
void grid_dependency_wait(int line);
void set_programmatic_launch(bool on);

// The emulated tensor map of a 2-D bulk tensor copy (the CUtensorMap the
// CUDA launcher encodes with cuTensorMapEncodeTiled from the same fields:
// shard_launch.cuh, WeightTiles): dims and box innermost first, the
// row stride in bytes, no swizzle, no interleave, out-of-bounds elements zero.
struct alignas(64) TensorMap2d {
  const void* base;
  uint64_t dims[2];
  uint64_t row_stride_bytes;
  uint32_t box[2];
  uint32_t elem_bytes;
};
// mbarrier (an 8-byte shared object; the emulation keeps its state aside,
// keyed by its shared offset): init, one arrival that expects `bytes` of
// transactions, and a blocking wait for the completion of the phase of
// parity `parity` (try_wait.parity in a loop; the fiber yields while the
// phase is not complete, so a phase that never completes is a deadlock).
void mbarrier_init(int line, void* bar, unsigned int count);
void mbarrier_arrive_expect_tx(int line, void* bar, unsigned int bytes);
void mbarrier_wait_parity(int line, void* bar, unsigned int parity);
// fence.proxy.async.shared::cta: this thread's generic accesses (and the
// block's, before the last barrier) ordered before its later bulk copies.
void fence_proxy_async(int line);
// cp.async.bulk.tensor.2d ... mbarrier::complete_tx::bytes: box (x, y) of map
// into shared memory at smem_dst (128-byte aligned), complete_tx on bar.
void tma_load_2d(int line, void* smem_dst, const TensorMap2d& map, int x, int y, void* bar);

template <typename V>
inline uint64_t to_bits(V v) {
  static_assert(sizeof(V) <= 8, "shuffle of a value wider than 64 bits");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(V));
  return u;
}
template <typename V>
inline V from_bits(uint64_t u) {
  V v;
  std::memcpy(&v, &u, sizeof(V));
  return v;
}
template <typename V>
inline V shfl_xor(int line, unsigned int mask, V v, int lane_mask, int width = 32) {
  if (width != 32) fail(line, "shuffle width other than 32 is not emulated");
  const int lane = g_thread->tid % 32;
  return from_bits<V>(shfl(line, mask, to_bits(v), lane ^ lane_mask));
}
template <typename V>
inline V shfl_idx(int line, unsigned int mask, V v, int src, int width = 32) {
  if (width != 32) fail(line, "shuffle width other than 32 is not emulated");
  return from_bits<V>(shfl(line, mask, to_bits(v), src & 31));
}

}  // namespace emu

#define threadIdx (::emu::g_thread->thread_idx)
#define blockIdx (::emu::g_launch.block_idx)
#define blockDim (::emu::g_launch.block_dim)
#define gridDim (::emu::g_launch.grid_dim)
#define __syncthreads() ::emu::syncthreads(__LINE__)
#define __syncthreads_and(p) ::emu::syncthreads_and(__LINE__, (p))
#define __shfl_xor_sync(...) ::emu::shfl_xor(__LINE__, __VA_ARGS__)
#define __shfl_sync(...) ::emu::shfl_idx(__LINE__, __VA_ARGS__)
#define __trap() ::emu::fail(__LINE__, "__trap()")

// Global memory: plain accesses in the instrumented kernel translation unit,
// so the memory checker sees them (a 16-byte load is one 16-byte access).
inline uint4 __ldg(const uint4* p) { return *p; }
inline uint4 __ldcs(const uint4* p) { return *p; }
inline unsigned long long atomicMax(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  if (value > old) *address = value;
  return old;
}
