// The CPU path choice (see cpu_path.h).
#include "cpu_path.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace localargmax {
namespace cpu {
namespace {

// The CPU paths in listing order; auto takes the last bit-exact one the CPU has.
const std::vector<CpuPathSpec>& path_specs() {
  static const std::vector<CpuPathSpec> specs = {
      {"generic", {}, true, "portable 8-lane float32 FMA loops"},
      {"avx2", {"avx2", "fma", "f16c"}, true, "AVX2 + FMA float32 loops"},
      {"avx512", {"avx2", "fma", "f16c", "avx512f"}, true, "AVX-512F float32 FMA loops"},
      {"avx512_bf16", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"}, false,
       "AVX-512-BF16 vdpbf16ps for bf16"},
      {"brgemm", {}, false, "ATen cpublas::brgemm (oneDNN; AMX tiles where could_pack) + our epilogue"},
  };
  return specs;
}

bool* feature_slot(CpuFeatures& f, const std::string& name) {
  if (name == "avx2") return &f.avx2;
  if (name == "fma") return &f.fma;
  if (name == "f16c") return &f.f16c;
  if (name == "avx512f") return &f.avx512f;
  if (name == "avx512bw") return &f.avx512bw;
  if (name == "avx512_bf16") return &f.avx512_bf16;
  if (name == "amx_tile") return &f.amx_tile;
  if (name == "amx_bf16") return &f.amx_bf16;
  if (name == "amx_fp16") return &f.amx_fp16;
  return nullptr;
}

bool has(const CpuFeatures& f, const char* name) {
  CpuFeatures copy = f;
  return *feature_slot(copy, name);
}

std::vector<const char*> missing(const CpuPathSpec& spec, const CpuFeatures& f) {
  std::vector<const char*> out;
  for (const char* need : spec.needs)
    if (!has(f, need)) out.push_back(need);
  return out;
}

}  // namespace

const std::vector<CpuPathSpec>& cpu_paths() { return path_specs(); }

const CpuFeatures& detect_cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    // AMX by CPUID leaf 7 (EDX 24 tile, 22 bf16; subleaf 1 EAX 21 fp16) and
    // the OS's XSAVE state (XCR0 bits 17, 18: XTILECFG, XTILEDATA).
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(1, 0, &a, &b, &c, &d) && (c & (1u << 27))) {  // OSXSAVE
      unsigned xcr0_lo = 0, xcr0_hi = 0;
      __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
      const bool os_tiles = (xcr0_lo & (3u << 17)) == (3u << 17);
      if (os_tiles && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.amx_tile = d & (1u << 24);
        f.amx_bf16 = f.amx_tile && (d & (1u << 22));
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.amx_fp16 = f.amx_tile && (a & (1u << 21));
      }
    }
#endif
    return f;
  }();
  return features;
}

CpuFeatures parse_cpu_features(const std::string& flags) {
  CpuFeatures f;
  std::istringstream in(flags);
  std::string name;
  while (in >> name)
    if (bool* slot = feature_slot(f, name)) *slot = true;
  return f;
}

// Where brgemm runs natively for weights of `dtype`: ATen's could_pack
// (oneDNN's AMX / AMX-FP16 ISA) by the CPU's features.
static bool brgemm_native(const CpuFeatures& f, WeightDtype dtype) {
  if (dtype == WeightDtype::kBFloat16) return f.amx_tile && f.amx_bf16;
  if (dtype == WeightDtype::kFloat16) return f.amx_tile && f.amx_fp16;
  return false;
}

std::string choose_cpu_path(const std::string& path, const CpuFeatures& features, WeightDtype dtype) {
  const auto& specs = path_specs();
  if (path == "auto") {
    if (brgemm_native(features, dtype)) return "brgemm";
    // bf16 weights at the CPU's bf16 dot products (vdpbf16ps) where it has them (DESIGN.md, "auto")
    if (dtype == WeightDtype::kBFloat16) {
      for (const CpuPathSpec& spec : specs)
        if (std::string(spec.name) == "avx512_bf16" && missing(spec, features).empty()) return spec.name;
    }
    for (auto spec = specs.rbegin(); spec != specs.rend(); ++spec)
      if (spec->bit_exact && missing(*spec, features).empty()) return spec->name;
  }
  for (const CpuPathSpec& spec : specs) {
    if (path != spec.name) continue;
    const std::vector<const char*> lacks = missing(spec, features);
    if (!lacks.empty()) {
      std::ostringstream msg;
      msg << "shard_argmax: path='" << path << "' needs a CPU with";
      for (size_t i = 0; i < spec.needs.size(); ++i) msg << (i ? ", " : " ") << spec.needs[i];
      msg << "; this CPU lacks";
      for (size_t i = 0; i < lacks.size(); ++i) msg << (i ? ", " : " ") << lacks[i];
      TORCH_CHECK_VALUE(false, msg.str());
    }
    return spec.name;
  }
  std::ostringstream names;
  names << "'auto'";
  for (size_t i = 0; i < specs.size(); ++i) names << (i + 1 < specs.size() ? ", '" : " or '") << specs[i].name << "'";
  TORCH_CHECK_VALUE(false, "shard_argmax: path must be ", names.str(), " on CPU, got '", path, "'");
  return "";
}

}  // namespace cpu
}  // namespace localargmax
