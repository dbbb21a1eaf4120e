// The tensor-core path ("mma") of the shard ops, bf16 / fp16 on sm_80+
// (fused_keys_mma.cuh): run_mma_path<TOPK>, which shard_mma.cu builds for
// argmax / sample and their log-partition twins and shard_mma_topk.cu for
// top-k (two translation units, so that ninja compiles the two kernel sets
// in parallel). See shard_paths.h.
//
// run_mma_path launches (launch_mma, shard_launch.cuh) the config the op
// names ("mma/<name>", mma_configs.h), else choose_mma_config's from the
// shared arguments, the device's SM count and auto_takes_tma. Where the loaded code and the device allow it
// (launch_features of the kernel's cudaFuncAttributes: sm_90+ code on an
// sm_90+ device) the kernel is launched with programmatic stream
// serialization (PDL): it issues its first weight stages, then
// griddepcontrol.wait before it reads anything an earlier kernel writes
// (hidden, bias, temperature, keys), so the weight streams while the kernel
// before it (the keys' zero fill, or the copy of a misaligned hidden) drains.
// The stages are dynamic shared memory (MmaConfig::dynamic_smem): past 48 KiB
// of static + dynamic (needs_smem_opt_in) the launcher raises the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize once per device and
// instantiation; auto never picks a config over the device's opt-in limit,
// and a forced one raises ValueError. The TMA configs (sm_90+; auto takes
// them where auto_takes_tma says the launch can) get the weight's tensor map,
// encoded once per weight, and a forced one below sm_90 raises ValueError.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "shard_launch.cuh"
#include "shard_paths.h"

namespace localargmax {
namespace cuda {
namespace {

// cudaFuncAttributeMaxDynamicSharedMemorySize of a kernel that takes more
// than the 48 KiB default, set once per (device, instantiation).
void allow_dynamic_smem(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (!done.insert({device, kernel}).second) return;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) done.erase({device, kernel});
  C10_CUDA_CHECK(err);
}

// The loaded kernel's launch features (launch_features of its
// cudaFuncAttributes), asked of the runtime once per (device, kernel).
LaunchFeatures kernel_features(const void* kernel, int device, int major) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, LaunchFeatures> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find({device, kernel});
  if (found != known.end()) return found->second;
  cudaFuncAttributes attr{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const LaunchFeatures f = launch_features(attr.ptxVersion, attr.binaryVersion, major);
  known.emplace(std::make_pair(device, kernel), f);
  return f;
}

struct MmaLaunch {
  int major;  // the device's compute capability major
  int device;
  // The weight's tensor map for a TMA config (sm_90+), from weight_tiles'
  // fields with the driver's cuTensorMapEncodeTiled, reached through the
  // runtime (cudaGetDriverEntryPointByVersion) so that nothing links libcuda.
  // Encoded once per weight: the map is a pure function of those fields
  // (base, dims, row stride, box, dtype), so a call with the same ones
  // reuses it (at most kMaxMaps remembered; past that the memo starts over).
  CUtensorMap weight_map(const WeightTiles& t, bool bf16, const void* kernel) const {
    TORCH_CHECK_VALUE(kernel_features(kernel, device, major).tma,
                      "shard_argmax: this TMA mma config's loaded code was not compiled for sm_90+ (an older-arch "
                      "build JIT-compiled for this device has no bulk tensor copy); build for this GPU "
                      "(LOCALARGMAX_CUDA_ARCH=90a) or pick another path");
    using Key = std::tuple<const void*, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, bool>;
    constexpr size_t kMaxMaps = 256;
    static std::mutex mutex;
    static std::map<Key, CUtensorMap> maps;
    const Key key{t.base, t.dims[0], t.dims[1], t.row_stride_bytes, t.box[0], t.box[1], bf16};
    {
      std::lock_guard<std::mutex> lock(mutex);
      const auto found = maps.find(key);
      if (found != maps.end()) return found->second;
    }
    using Encode = decltype(&cuTensorMapEncodeTiled);
    static const Encode encode = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
      TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                  "shard_argmax: the CUDA driver has no cuTensorMapEncodeTiled (needed by the TMA mma configs)");
      return reinterpret_cast<Encode>(fn);
    }();
    CUtensorMap map;
    const cuuint64_t dims[2] = {t.dims[0], t.dims[1]};
    const cuuint64_t strides[1] = {t.row_stride_bytes};  // (the innermost stride is the element)
    const cuuint32_t box[2] = {t.box[0], t.box[1]};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                              const_cast<void*>(t.base), dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TORCH_CHECK(r == CUDA_SUCCESS, "shard_argmax: cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r),
                ") for the weight's tensor map: dims {", t.dims[0], ", ", t.dims[1], "}, row stride ",
                t.row_stride_bytes, " bytes, box {", t.box[0], ", ", t.box[1], "}, base ", t.base);
    std::lock_guard<std::mutex> lock(mutex);
    if (maps.size() >= kMaxMaps) maps.clear();
    maps.emplace(key, map);
    return map;
  }
  template <typename... P, typename... Args>
  void operator()(const char*, void (*kernel)(P...), dim3 grid, dim3 block, DynamicSmem smem,
                  const Args&... args) const {
    if (needs_smem_opt_in(smem)) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem.bytes, device);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<size_t>(smem.bytes);
    config.stream = c10::cuda::getCurrentCUDAStream();
    config.attrs = attr;
    config.numAttrs = kernel_features(reinterpret_cast<const void*>(kernel), device, major).pdl ? 1 : 0;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<P>(args)...));
  }
};

// What launch_mma needs of a device (SM count, compute capability major,
// opt-in shared memory per block), asked of the runtime once per device.
struct MmaDevice {
  int sms = 0, major = 0, smem_limit = 0;
};
MmaDevice mma_device(int device) {
  static std::mutex mutex;
  static std::map<int, MmaDevice> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(device);
  if (found != known.end()) return found->second;
  MmaDevice d;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  known.emplace(device, d);
  return d;
}

}  // namespace

template <bool TOPK, typename T>
int64_t run_mma_path(const ShardArgmaxProblem<T>& p, int config) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const MmaDevice d = mma_device(device);
  if (config >= 0) {
    const MmaConfig& c = kMmaConfigs[config];
    TORCH_CHECK_VALUE(p.out.block_partition == nullptr || mma_config_takes_lse(config), "log_partition: mma config '",
                      c.name, "' (TMA) has no log-partition; force its cp.async twin or pass path='mma'");
    TORCH_CHECK_VALUE(!TOPK || c.topk(), "shard_topk: mma config '", c.name, "' has no top-k (",
                      c.tma ? "a TMA row: force its cp.async twin, the same sums" : "more than 16 mma tiles a warp: "
                      "force n16_r64, the same sums", ", or pass path='mma')");
    TORCH_CHECK_VALUE(!c.tma || d.major >= 9, "shard_argmax: mma config '", c.name,
                      "' copies the weight by TMA (bulk tensor copy), which needs compute capability 9.0 or newer; "
                      "this device (", device, ") is ", d.major, ".x");
    TORCH_CHECK_VALUE(mma_config_fits(config, d.smem_limit), "shard_argmax: mma config '", c.name, "' needs ",
                      c.smem(), " bytes of shared memory per block; this device (", device, ") allows ",
                      d.smem_limit, " (cudaDevAttrMaxSharedMemoryPerBlockOptin)");
  }
  if (config < 0) {  // auto: the TMA rows where this launch can run them (choose_mma_config; top-k: none)
    bool tma = false;
    if constexpr (!TOPK) {
      const void* n1_tma =
          reinterpret_cast<const void*>(MmaKernel<mma_config_index("n1_r64_tma")>::template kernel<T>());
      const bool tma_code = d.major >= 9 && kernel_features(n1_tma, device, d.major).tma;
      tma = auto_takes_tma(tma_code, p.out.block_partition != nullptr);
    }
    config = choose_mma_config(p.hidden_size, p.num_valid, p.batch, d.sms, d.smem_limit, tma, TOPK);
  }
  return launch_mma<TOPK>(p, MmaLaunch{d.major, device}, kMaxGridY, d.sms, config, d.smem_limit);
}

}  // namespace cuda
}  // namespace localargmax
