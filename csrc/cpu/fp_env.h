// The floating-point environment of the CPU kernels' parallel bodies.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace localargmax {
namespace cpu {

// Clears flush-to-zero (MXCSR bit 15) and denormals-are-zero (bit 6) for its
// scope and restores the thread's own bits after. MXCSR is per thread:
// torch.set_flush_denormal(True) sets it on the calling thread only, not on
// the OpenMP workers made before, so without this a call's keys followed the
// thread count (DESIGN.md, "CPU paths": denormals kept). Constructed at the
// top of every at::parallel_for body of the CPU kernels (each path, each ISA
// build). Instructions that flush regardless of MXCSR (vdpbf16ps, AMX tiles)
// still flush; DESIGN.md says which paths. No-op off x86.
class KeepDenormals {
 public:
  KeepDenormals(const KeepDenormals&) = delete;
  KeepDenormals& operator=(const KeepDenormals&) = delete;
#if defined(__x86_64__) || defined(__i386__)
  KeepDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero)); }
  ~KeepDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000u;
  static constexpr unsigned kDenormalsAreZero = 0x0040u;
  unsigned saved_;
#else
  KeepDenormals() {}
#endif
};

}  // namespace cpu
}  // namespace localargmax
