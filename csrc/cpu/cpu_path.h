// Which CPU kernel a call runs: the CPU's ISA features (CPUID, read once) and
// the ops' `path` argument -> one path name. A pure function of its inputs
// (choose_cpu_path), never of the batch or the shapes, so every batch
// position and every rank on one kind of CPU runs the same instructions per
// (row, k). localargmax._C._cpu_path exports it to Python (with fake feature
// sets for the tests).
#pragma once

#include <string>
#include <vector>

#include "shard_argmax_tiles.h"

namespace localargmax {
namespace cpu {

// The ISA features the CPU paths use, by their /proc/cpuinfo names.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;  // AMX tiles, enabled by the OS (XCR0 bits 17, 18)
  bool amx_bf16 = false;
  bool amx_fp16 = false;
};

// One CPU path: its name, the /proc/cpuinfo features it needs, whether its
// keys are bit-identical to generic's for every dtype (DESIGN.md rule 5; the
// ones auto may take) and what its inner loop is (the benchmark's legend).
struct CpuPathSpec {
  const char* name;
  std::vector<const char*> needs;
  bool bit_exact;
  const char* inner_loop;
};

// Every CPU path, in listing order (generic first); localargmax._C._cpu_paths
// exports it to Python.
const std::vector<CpuPathSpec>& cpu_paths();

// This CPU's features (CPUID and the OS's XSAVE state, via
// __builtin_cpu_supports), read once per process.
const CpuFeatures& detect_cpu_features();

// Features from a space-separated list of /proc/cpuinfo flag names (unknown
// names are ignored).
CpuFeatures parse_cpu_features(const std::string& flags);

// The CPU path `path` runs on a CPU with `features` for weights of `dtype`:
//   "generic"      baseline ISA, always;
//   "avx2"         needs avx2, fma, f16c;
//   "avx512"       needs avx2, fma, f16c, avx512f;
//   "avx512_bf16"  needs those and avx512bw, avx512_bf16;
//   "brgemm"       ATen's cpublas::brgemm (oneDNN), needs no feature of its
//                  own (ATen falls back where oneDNN cannot run it);
//   "auto"         brgemm where it runs natively (AMX tiles: amx_tile and
//                  amx_bf16 for bfloat16, amx_tile and amx_fp16 for float16
//                  weights; not bit-identical to generic's, DESIGN.md "CPU
//                  paths"), else the last bit-exact path of cpu_paths() the
//                  CPU has (avx512, else avx2, else generic): the fastest path
//                  whose keys are bit-identical to generic's (DESIGN.md rule
//                  5); avx512_bf16 (vdpbf16ps) only by name.
// A named path the CPU lacks: ValueError naming the missing features; any
// other name: ValueError listing the names.
std::string choose_cpu_path(const std::string& path, const CpuFeatures& features,
                            WeightDtype dtype = WeightDtype::kFloat32);

}  // namespace cpu
}  // namespace localargmax
