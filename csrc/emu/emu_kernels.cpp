// The CUDA kernels, compiled from their unmodified headers for the host SIMT
// emulation (simt_emu.h), with the launch choices of shard_launch.cuh,
// behind a C ABI for tests/test_emulation.py (ctypes). This translation unit
// is the instrumented one (-fsanitize=thread hooks, simt_emu.cpp); it must
// hold no static data of its own: its .bss becomes shared memory.
#include <cstdint>
#include <cstdio>
#include <string>

#include "../cuda/merge_keys_kernel.cuh"
#include "../cuda/shard_launch.cuh"
#include "../cuda/step_kernels.cuh"
#include "simt_emu_runtime.h"

namespace emu {
void note_launch(const void* kernel, const char* family);   // simt_emu.cpp
void name_kernel(const void* kernel, const char* name);
bool kernels_named();
}  // namespace emu

namespace localargmax {
namespace cuda {
namespace {

template <auto Kernel>
const char* kernel_name() {
  return __PRETTY_FUNCTION__;
}

template <typename T, int I>
void name_mma_row() {
  emu::name_kernel(reinterpret_cast<const void*>(MmaKernel<I>::template kernel<T>()),
                   kernel_name<MmaKernel<I>::template kernel<T>()>());
}

template <typename T, int... I>
void name_mma(std::integer_sequence<int, I...>) {
  (name_mma_row<T, I>(), ...);
}

template <typename T>
void name_typed() {
  constexpr int kVec = 16 / sizeof(T);
  const auto simt = [](auto k, const char* n) { emu::name_kernel(reinterpret_cast<const void*>(k), n); };
#define LAM_NB(NB)                                                                                        \
  simt(shard_argmax_kernel<T, NB, kVec, false>, kernel_name<shard_argmax_kernel<T, NB, kVec, false>>()); \
  simt(shard_argmax_kernel<T, NB, 1, false>, kernel_name<shard_argmax_kernel<T, NB, 1, false>>());       \
  simt(shard_argmax_kernel<T, NB, kVec, true>, kernel_name<shard_argmax_kernel<T, NB, kVec, true>>());   \
  simt(shard_argmax_kernel<T, NB, 1, true>, kernel_name<shard_argmax_kernel<T, NB, 1, true>>());         \
  simt(shard_argmax_kernel<T, NB, kVec, false, true>,                                                     \
       kernel_name<shard_argmax_kernel<T, NB, kVec, false, true>>());                                     \
  simt(shard_argmax_kernel<T, NB, 1, false, true>, kernel_name<shard_argmax_kernel<T, NB, 1, false, true>>()); \
  simt(shard_argmax_kernel<T, NB, kVec, true, true>, kernel_name<shard_argmax_kernel<T, NB, kVec, true, true>>()); \
  simt(shard_argmax_kernel<T, NB, 1, true, true>, kernel_name<shard_argmax_kernel<T, NB, 1, true, true>>());
  LAM_NB(1) LAM_NB(2) LAM_NB(4) LAM_NB(8)
#undef LAM_NB
  if constexpr (!std::is_same_v<T, float>) {
    name_mma<T>(std::make_integer_sequence<int, kNumMmaConfigs>{});
    simt(logits_to_keys_kernel<T>, kernel_name<logits_to_keys_kernel<T>>());
    simt(logits_to_keys_kernel<T, true>, kernel_name<logits_to_keys_kernel<T, true>>());
  }
}

// LAM_EMU_BF16_ONLY: only the bfloat16 instantiations (a third of the compile
// time), for the mutation tests' many builds.
#if defined(LAM_EMU_BF16_ONLY)
constexpr bool kAllDtypes = false;
#else
constexpr bool kAllDtypes = true;
#endif

void name_all() {
  if (emu::kernels_named()) return;
  if constexpr (kAllDtypes) name_typed<float>();
  name_typed<__nv_bfloat16>();
  if constexpr (kAllDtypes) name_typed<__half>();
  emu::name_kernel(reinterpret_cast<const void*>(merge_keys_kernel), kernel_name<merge_keys_kernel>());
  emu::name_kernel(reinterpret_cast<const void*>(merge_partition_kernel), kernel_name<merge_partition_kernel>());
  emu::name_kernel(reinterpret_cast<const void*>(frame_init_kernel), kernel_name<frame_init_kernel>());
  emu::name_kernel(reinterpret_cast<const void*>(merge_frames_kernel), kernel_name<merge_frames_kernel>());
  emu::name_kernel(reinterpret_cast<const void*>(log_probs_from_pairs_kernel),
                   kernel_name<log_probs_from_pairs_kernel>());
}

// The launch functor of shard_launch.cuh for the emulation (the
// launches without dynamic shared memory, and the tensor-core ones with it).
struct EmuLaunch {
  bool* ok;
  template <typename... P, typename... Args>
  void operator()(const char* family, void (*kernel)(P...), dim3 grid, dim3 block, DynamicSmem smem,
                  const Args&... args) const {
    auto call = [&] { kernel(args...); };
    using Call = decltype(call);
    emu::note_launch(reinterpret_cast<const void*>(kernel), family);
    // as shard_mma.cu launches it on sm_90+ (the emulation checks the stricter case)
    emu::set_programmatic_launch(std::string(family) == kMmaPipeFamily);
    // the opt-in rule of shard_mma.cu's launcher (cudaFuncSetAttribute there)
    if (needs_smem_opt_in(smem)) emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), smem.bytes);
    *ok = *ok && emu::launch(family, [](void* c) { (*static_cast<Call*>(c))(); }, &call, grid, block,
                             static_cast<size_t>(smem.bytes), reinterpret_cast<const void*>(kernel),
                             static_cast<size_t>(smem.static_bytes));
  }
  template <typename... P, typename... Args>
  void operator()(const char* family, void (*kernel)(P...), dim3 grid, dim3 block, const Args&... args) const {
    (*this)(family, kernel, grid, block, DynamicSmem{0}, args...);
  }
  // The TMA configs' tensor map, from the fields the CUDA launcher encodes
  // its CUtensorMap from (shard_launch.cuh, weight_tiles).
  emu::TensorMap2d weight_map(const WeightTiles& t, bool /*bf16*/, const void* /*kernel*/) const {
    return emu::TensorMap2d{t.base, {t.dims[0], t.dims[1]}, t.row_stride_bytes, {t.box[0], t.box[1]}, t.elem_bytes};
  }
};

// A kernel launched for the shared-memory rule's test (lam_emu_smem_probe):
// its block writes the last byte of the dynamic shared memory it was given.
void smem_probe_kernel(int dynamic_bytes) {  // a host function: kernels live in csrc/cuda
  if (threadIdx.x == 0 && dynamic_bytes > 0) static_cast<char*>(emu::dynamic_shared())[dynamic_bytes - 1] = 1;
}

// *blocks (when given): the grid's blocks along x, the rows of the
// log-partition states the launch wrote.
template <typename T>
int run_shard(int path, int topk_mode, const ShardArgmaxProblem<T>& p, int64_t max_grid_y, int sm_count,
              int config, int smem_limit, int64_t* blocks = nullptr) {
  bool ok = true;
  int64_t used = simt_blocks(p);
  if (path == 1) {
    if constexpr (std::is_same_v<T, float>) {
      return 2;
    } else {
      if (!mma_takes(p)) return 2;
      if (config >= kNumMmaConfigs) return 4;
      if (config >= 0 && !mma_config_fits(config, smem_limit)) return 5;  // run_mma's ValueError
      if (config >= 0 && p.out.block_partition != nullptr && !mma_config_takes_lse(config)) return 6;  // (also)
      if (config >= 0 && topk_mode && !kMmaConfigs[config].topk()) return 7;                          // (also)
      used = topk_mode ? launch_mma<true>(p, EmuLaunch{&ok}, max_grid_y, sm_count, config, smem_limit)
                       : launch_mma<false>(p, EmuLaunch{&ok}, max_grid_y, sm_count, config, smem_limit);
    }
  } else if (topk_mode) {
    launch_simt<T, true>(p, EmuLaunch{&ok}, max_grid_y);
  } else {
    launch_simt<T, false>(p, EmuLaunch{&ok}, max_grid_y);
  }
  if (blocks != nullptr) *blocks = used;
  return ok ? 0 : 1;
}

template <typename T>
ShardArgmaxProblem<T> problem(const void* hidden, int64_t ldh, const void* weight, int64_t ldw, const void* bias_t,
                              const float* bias_f, int64_t batch, int64_t hidden_size, int64_t num_valid,
                              int64_t vocab_start, const ShardReduce& out) {
  const auto [typed, f32] = bias_of<T>(Bias{bias_f != nullptr ? static_cast<const void*>(bias_f) : bias_t, bias_f != nullptr});
  return ShardArgmaxProblem<T>{static_cast<const T*>(hidden), ldh, static_cast<const T*>(weight), ldw, typed, f32, batch,
                               hidden_size, num_valid, vocab_start, out};
}

}  // namespace
}  // namespace cuda
}  // namespace localargmax

using namespace localargmax::cuda;

extern "C" {

// noise=vllm_noise(...)'s [batch] seeds and positions (arena pointers) for the next
// launches of lam_emu_logits_to_keys (the gemm path, the only one that takes
// them on CUDA), or nullptr (the Philox noise), as shard_ops_cuda.cu puts them
// in ShardReduce.
// In .data: this object's zero-initialised section is the kernels' shared memory alone
// (tests/test_emulation.py checks what lies between __start/__stop_lam_emu_shared).
__attribute__((section(".data"))) static const int64_t* g_noise_seed = nullptr;
__attribute__((section(".data"))) static const int64_t* g_noise_pos = nullptr;
void lam_emu_set_noise(const int64_t* seeds, const int64_t* pos) {
  g_noise_seed = seeds;
  g_noise_pos = pos;
}

// dtype: 0 float32, 1 bfloat16, 2 float16. path: 0 CUDA-core ("simt"), 1
// tensor-core ("mma"). Returns 0, 1 (a checked failure: lam_emu_last_error),
// 2 (the mma kernel does not take this problem), 3 (dtype not built), 4
// (no such mma config), 5 (the forced config's shared memory exceeds
// smem_limit), 6 (a forced TMA config with the log-partition) or 7 (a forced config without top-k, top-k).
// mma: config < 0 is launch_mma's choice for a device of sm_count SMs and
// smem_limit bytes of opt-in shared memory per block, else that row of
// kMmaConfigs (mma_configs.h). *blocks: the grid's blocks along x (the rows of
// block_topk the launch wrote).
int lam_emu_shard(int dtype, int path, int topk_mode, const void* hidden, int64_t ldh, const void* weight,
                  int64_t ldw, const void* bias_t, const float* bias_f, int64_t batch, int64_t hidden_size,
                  int64_t num_valid, int64_t vocab_start, unsigned long long* keys, unsigned long long* block_topk,
                  int topk, const float* temperature, uint64_t seed, uint64_t offset, int64_t max_grid_y,
                  int sm_count, int config, int smem_limit, int64_t* blocks) {
  name_all();
  const ShardReduce out{
      .keys = keys, .block_topk = block_topk, .topk = topk, .temperature = temperature, .seed = seed, .offset = offset};
#define LAM_ARGS hidden, ldh, weight, ldw, bias_t, bias_f, batch, hidden_size, num_valid, vocab_start, out
#define LAM_LAUNCH max_grid_y, sm_count, config, smem_limit, blocks
  if (dtype == 1) return run_shard(path, topk_mode, problem<__nv_bfloat16>(LAM_ARGS), LAM_LAUNCH);
  if constexpr (kAllDtypes) {
    if (dtype == 0) return run_shard(path, topk_mode, problem<float>(LAM_ARGS), LAM_LAUNCH);
    return run_shard(path, topk_mode, problem<__half>(LAM_ARGS), LAM_LAUNCH);
  }
  return 3;
#undef LAM_LAUNCH
#undef LAM_ARGS
}

// launch_mma's auto choice (a row of kMmaConfigs), the number of rows, and
// row i's name (nullptr past the table), as the emulation compiled them.
int lam_emu_mma_config(int64_t hidden_size, int64_t num_valid, int64_t batch, int sm_count, int smem_limit,
                       int topk) {
  return choose_mma_config(hidden_size, num_valid, batch, sm_count, smem_limit, false, topk != 0);
}
int lam_emu_num_mma_configs() { return kNumMmaConfigs; }
const char* lam_emu_mma_config_name(int i) { return i >= 0 && i < kNumMmaConfigs ? kMmaConfigs[i].name : nullptr; }

// lam_emu_shard with the log-partition (the *_lse ops): per-block states
// into `states` [*blocks, batch] (then lam_emu_merge_partition over *blocks
// rows, as shard_ops_cuda.cu does); partition_temperature: shard_argmax_lse's
// [batch] T > 0 of the sums, or nullptr.
int lam_emu_shard_lse(int dtype, int path, int topk_mode, const void* hidden, int64_t ldh, const void* weight,
                      int64_t ldw, const void* bias_t, const float* bias_f, int64_t batch, int64_t hidden_size,
                      int64_t num_valid, int64_t vocab_start, unsigned long long* keys,
                      unsigned long long* block_topk, int topk, const float* temperature, uint64_t seed,
                      uint64_t offset, int64_t max_grid_y, int sm_count, int config, int smem_limit, void* states,
                      float scale, float soft_cap, const float* partition_temperature, int64_t* blocks) {
  name_all();
  ShardReduce out{
      .keys = keys, .block_topk = block_topk, .topk = topk, .temperature = temperature, .seed = seed, .offset = offset};
  out.block_partition = static_cast<localargmax::PartitionState*>(states);
  out.partition_temperature = partition_temperature != nullptr ? partition_temperature : temperature;  // as the host
  out.scale = scale;
  out.soft_cap = soft_cap;
#define LAM_ARGS hidden, ldh, weight, ldw, bias_t, bias_f, batch, hidden_size, num_valid, vocab_start, out
#define LAM_LAUNCH max_grid_y, sm_count, config, smem_limit, blocks
  int rc = 3;
  if (dtype == 1) rc = run_shard(path, topk_mode, problem<__nv_bfloat16>(LAM_ARGS), LAM_LAUNCH);
  if constexpr (kAllDtypes) {
    if (dtype == 0) rc = run_shard(path, topk_mode, problem<float>(LAM_ARGS), LAM_LAUNCH);
    if (dtype == 2) rc = run_shard(path, topk_mode, problem<__half>(LAM_ARGS), LAM_LAUNCH);
  }
#undef LAM_LAUNCH
#undef LAM_ARGS
  return rc;
}

// merge_partition_kernel over `blocks` rows of states [blocks, batch] -> pairs [batch, 2].
int lam_emu_merge_partition(const void* states, int64_t blocks, int64_t batch, const float* temperature,
                            float* pairs) {
  name_all();
  bool ok = true;
  launch_merge_partition(static_cast<const localargmax::PartitionState*>(states), blocks, batch, temperature, pairs,
                         EmuLaunch{&ok});
  return ok ? 0 : 1;
}

// The gemm path's keys kernel over float32 logits [rows, ldl] of batch rows b0..
// (states: the log-partition states [blocks, batch], or nullptr;
// partition_temperature as in lam_emu_shard_lse).
int lam_emu_logits_to_keys(int dtype, const float* logits, int64_t ldl, int64_t rows, int64_t b0, const void* bias_t,
                           const float* bias_f, int64_t batch, int64_t num_valid, int64_t vocab_start,
                           unsigned long long* keys, const float* temperature, uint64_t seed, uint64_t offset,
                           int64_t max_grid_y, void* states, float scale, float soft_cap,
                           const float* partition_temperature) {
  name_all();
  bool ok = true;
  ShardReduce out{.keys = keys, .temperature = temperature, .seed = seed, .offset = offset};
  out.noise_seed = g_noise_seed;
  out.noise_pos = g_noise_pos;
  out.block_partition = static_cast<localargmax::PartitionState*>(states);
  out.partition_temperature = partition_temperature != nullptr ? partition_temperature : temperature;  // as the host
  out.scale = scale;
  out.soft_cap = soft_cap;
#define LAM_ARGS nullptr, 0, nullptr, 0, bias_t, bias_f, batch, 0, num_valid, vocab_start, out
  if (dtype == 1)
    launch_logits_to_keys(logits, ldl, rows, b0, problem<__nv_bfloat16>(LAM_ARGS), EmuLaunch{&ok}, max_grid_y);
  else if constexpr (kAllDtypes)
    launch_logits_to_keys(logits, ldl, rows, b0, problem<__half>(LAM_ARGS), EmuLaunch{&ok}, max_grid_y);
  else
    return 3;
#undef LAM_ARGS
  return ok ? 0 : 1;
}

// merge_keys_kernel with merge_keys_cuda.cu's grid.
int lam_emu_merge_keys(const unsigned long long* keys, int64_t tp, int64_t batch, int has_d2t, const int64_t* d2t,
                       int64_t draft_vocab, int64_t* ids, float* values) {
  name_all();
  bool ok = true;
  const int64_t blocks = (batch + kMergeThreads - 1) / kMergeThreads;
  EmuLaunch{&ok}("merge_keys_kernel", merge_keys_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kMergeThreads),
                 keys, tp, batch, has_d2t != 0, d2t, draft_vocab, ids, values);
  return ok ? 0 : 1;
}

// frame_init_kernel with shard_ops_cuda.cu's grid: a frame's header (size
// words of n keys, with the pairs flag when pairs != 0, and vocab_end) and
// its first zero_words keys zeroed.
int lam_emu_frame_init(int64_t* frame, int64_t n, int pairs, int64_t vocab_end, int64_t zero_words) {
  name_all();
  bool ok = true;
  const int64_t size = n + 1 + (pairs ? localargmax::kPairsFlag : 0);
  const int64_t blocks = (std::max<int64_t>(zero_words, 1) + kStepThreads - 1) / kStepThreads;
  EmuLaunch{&ok}("frame_init_kernel", frame_init_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kStepThreads),
                 frame, size, vocab_end, zero_words);
  return ok ? 0 : 1;
}

// merge_frames_kernel as merge_keys_cuda.cu launches it (one block): frames
// [tp, stride] words; d2t / temperature / log_probs / log_odds may be null;
// *valid receives the step's flag.
int lam_emu_merge_frames(const unsigned long long* frames, int64_t tp, int64_t stride, int64_t batch, int64_t k,
                         int pairs, int flipped, int mode, const int64_t* d2t, int64_t d2t_len, int64_t target_vocab,
                         const float* temperature, int64_t* ids, float* values, float* log_probs, float* log_odds,
                         bool* valid) {
  name_all();
  bool ok = true;
  const localargmax::MergeFrames a{reinterpret_cast<const uint64_t*>(frames), tp, stride, batch, k, pairs != 0,
                                    flipped != 0, mode, d2t != nullptr, d2t, d2t_len, target_vocab, temperature,
                                    ids, values, log_probs, log_odds};  // the fields in MergeFrames' order
  EmuLaunch{&ok}("merge_frames_kernel", merge_frames_kernel, dim3(1), dim3(kStepThreads), a, valid);
  return ok ? 0 : 1;
}

// log_probs_from_pairs_kernel as merge_keys_cuda.cu launches it: values [batch, k], pairs [tp, batch, 2],
// temperature [batch] or null, out [batch, k].
int lam_emu_log_probs_from_pairs(const float* values, const float* pairs, const float* temperature, int64_t tp,
                                 int64_t batch, int64_t k, float* out) {
  name_all();
  bool ok = true;
  if (batch == 0 || k == 0) return 0;  // the launcher launches nothing
  const int64_t blocks = (batch + kStepThreads - 1) / kStepThreads;
  EmuLaunch{&ok}("log_probs_from_pairs_kernel", log_probs_from_pairs_kernel, dim3(static_cast<unsigned>(blocks)),
                 dim3(kStepThreads), values, pairs, temperature, tp, batch, k, out);
  return ok ? 0 : 1;
}

// launch_features (shard_launch.cuh) of a kernel's cudaFuncAttributes
// on a device: bit 0 PDL, bit 1 TMA.
int lam_emu_launch_features(int ptx_version, int binary_version, int device_major) {
  const LaunchFeatures f = launch_features(ptx_version, binary_version, device_major);
  return (f.pdl ? 1 : 0) | (f.tma ? 2 : 0);
}

// A launch of static_bytes + dynamic_bytes of shared memory through the
// emulation's launch functor, which opts in as shard_mma.cu's launcher
// does (needs_smem_opt_in); with raw != 0, through emu::launch directly with
// the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize set to opt_in
// bytes (0: the 48 KiB default). Returns 0 launched, 1 refused
// (lam_emu_last_error).
int lam_emu_smem_probe(int static_bytes, int dynamic_bytes, int raw, int opt_in) {
  emu::reset_max_dynamic_shared();
  const void* fn = reinterpret_cast<const void*>(smem_probe_kernel);
  if (!raw) {
    bool ok = true;
    EmuLaunch{&ok}("smem_probe_kernel", smem_probe_kernel, dim3(1), dim3(32), DynamicSmem{dynamic_bytes, static_bytes},
                   dynamic_bytes);
    return ok ? 0 : 1;
  }
  if (opt_in > 0) emu::set_max_dynamic_shared(fn, static_cast<size_t>(opt_in));
  auto call = [&] { smem_probe_kernel(dynamic_bytes); };
  using Call = decltype(call);
  return emu::launch("smem_probe_kernel", [](void* c) { (*static_cast<Call*>(c))(); }, &call, dim3(1), dim3(32),
                     static_cast<size_t>(dynamic_bytes), fn, static_cast<size_t>(static_bytes))
             ? 0
             : 1;
}

// The noise screen's float bounds (common/philox.h) on the n words x =
// first + i * stride (mod 2^32): the largest |gumbel_estimate(x) -
// gumbel_of_word(x)| / gumbel_slack(gumbel_estimate(x)) (below 1: the
// bounds hold), and in *max_noise the largest gumbel_of_word(x).
double lam_emu_noise_bounds(uint32_t first, uint32_t stride, uint64_t n, float* max_noise) {
  double worst = 0.0;
  float top = -INFINITY;
  uint32_t x = first;
  for (uint64_t i = 0; i < n; ++i, x += stride) {
    const float exact = localargmax::gumbel_of_word(x), g = localargmax::gumbel_estimate(x);
    worst = std::fmax(worst, std::fabs(static_cast<double>(g) - exact) / localargmax::gumbel_slack(g));
    top = std::fmax(top, exact);
  }
  *max_noise = top;
  return worst;
}

}  // extern "C"
