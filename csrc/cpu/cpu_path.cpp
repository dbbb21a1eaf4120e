// The CPU path choice (see cpu_path.h).
#include "cpu_path.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <vector>

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

std::string choose_cpu_path(const std::string& path, const CpuFeatures& features) {
  const auto& specs = path_specs();
  if (path == "auto") {
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
