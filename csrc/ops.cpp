// The whole operator surface of localargmax, in one screen. Each backend
// registers its implementations next to them (cpu/*.cpp, cuda/*.cu).
#include <Python.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "cpu/cpu_path.h"
#include "cpu/shard_argmax_brgemm.h"
#include "cuda/mma_configs.h"  // plain C++: the table exists in every build

TORCH_LIBRARY(localargmax, m) {
  // hidden [B, H], weight [rows, H], bias [rows]? -> packed keys [B] int64
  // path: which kernel runs: "auto", CPU "generic" | "avx2" | "avx512" | "avx512_bf16", CUDA "simt" | "mma" |
  // "gemm", or "mma/<name>" (one config of cuda/mma_configs.h, sent by the Python layer's private keyword)
  // (a forced path that cannot take the inputs raises ValueError; see localargmax/ops.py)
  m.def("shard_argmax(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "str path=\"auto\") -> Tensor");
  // the k largest keys per row, descending (0 = empty slot): [B, k] int64, 1 <= k <= 64
  m.def("shard_topk(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, int k, "
        "str path=\"auto\") -> Tensor");
  // Gumbel-max: key of logit / T + Gumbel(seed, offset + b, global index); T == 0 rows greedy. [B] int64.
  // With noise_seed and noise_pos ([B] int64 each, both or neither): vLLM 0.34's noise and score instead,
  // fl(logit / T) + g(noise_seed[b], noise_pos[b], global index) (common/vllm_noise.h); seed, offset unused.
  m.def("shard_sample(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "Tensor temperature, int seed, int offset, str path=\"auto\", Tensor? noise_seed=None, "
        "Tensor? noise_pos=None) -> Tensor");
  // The same three with the log-partition (DESIGN.md, "Log-probabilities"): every logit is first
  // transformed (soft_cap > 0: tanh(x / soft_cap) * soft_cap; then * scale), the keys carry the
  // transformed values, and per row the second output [B, 2] float32 holds the shard's pair
  // (ref, others): ref = the value of the row's best key (a sample: its transformed logit), -inf
  // for an empty shard; others = sum over the other valid entries of exp((x - ref) / T) (T: the
  // sampling temperature of rows with T > 0; shard_argmax_lse's temperature [B] (T > 0) if given;
  // else 1).
  m.def("shard_argmax_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "float scale=1.0, float soft_cap=0.0, str path=\"auto\", Tensor? temperature=None) -> (Tensor, Tensor)");
  m.def("shard_topk_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, int k, "
        "float scale=1.0, float soft_cap=0.0, str path=\"auto\") -> (Tensor, Tensor)");
  m.def("shard_sample_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "Tensor temperature, int seed, int offset, float scale=1.0, float soft_cap=0.0, str path=\"auto\", "
        "Tensor? noise_seed=None, Tensor? noise_pos=None) -> (Tensor, Tensor)");
  // keys [tp, B] or [B] int64, d2t [draft_vocab]? int64 -> (ids [B] int64, values [B] float32)
  m.def("merge_keys(Tensor keys, Tensor? d2t) -> (Tensor, Tensor)");
  // The planned step (DESIGN.md, "The planned step"): one rank's fused op (mode 0 argmax, 1 top-k, 2 sample;
  // the *_lse op with log_partition; temperature: sampling's, or the argmax log-partition's) and its frame
  // [size, -size, vocab_end, keys (B*k), pairs (B words, with send_pairs)], every word XOR the sign bit with
  // sign_flip (an all-reduce MAX's frame), in one op: the payload a collective moves as it is.
  m.def("step_frame(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, int mode, int k, "
        "Tensor? temperature, int seed, int offset, float scale, float soft_cap, bool log_partition, bool send_pairs, "
        "bool sign_flip, str path=\"auto\", Tensor? noise_seed=None, Tensor? noise_pos=None) -> Tensor");
  // Every rank's frame [tp, words] (or [words]) -> (ids, values, log_probs, log_odds, ok): the headers checked,
  // the winner (or the k largest keys) over the ranks, d2t applied (mapped ids in [0, target_vocab) when
  // target_vocab > 0), log-probabilities / log-odds from the pairs (common/step_merge.h); ok [] bool clear on a
  // failed check (raise_errors, CPU only: ValueError instead). ids / values [batch] ([batch, k] for top-k).
  m.def("merge_frames(Tensor frames, SymInt batch, int k, bool pairs, int mode, Tensor? d2t, int target_vocab, "
        "Tensor? temperature, bool log_probs, bool log_odds, bool sign_flipped, bool raise_errors) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  // values [B] or [B, k] float32, pairs [tp, B, 2] float32, temperature [B] float32? -> log-probabilities (values'
  // shape): the step's merge's arithmetic (common/step_merge.h, row_partition), for steps that merge in Python.
  m.def("log_probs_from_pairs(Tensor values, Tensor pairs, Tensor? temperature) -> Tensor");
  // The samplers' Gumbel noise (common/philox.h) at (seed, rows[i], ids[i]): rows (uint64 bits) and ids (>= 0)
  // int64 of one shape -> float32 of that shape. CPU only (on CUDA, localargmax.sampling evaluates it in torch).
  m.def("gumbel_noise(int seed, Tensor rows, Tensor ids) -> Tensor");
  // vLLM 0.34's Gumbel noise (common/vllm_noise.h) at (seeds[i], pos[i], ids[i]), int64 of one shape (ids >= 0)
  // -> float32 of that shape (float64: use_fp64_gumbel's noise). CPU only (elsewhere vllm_gumbel.torch_gumbel32).
  m.def("vllm_gumbel_noise(Tensor seeds, Tensor pos, Tensor ids, bool fp64=False) -> Tensor");
}

// The planned step's ops are called once per step: their autograd kernel is C++'s (a backward through
// them raises, naming the op) rather than a Python one (localargmax/ops.py's FUSED_OPS), which would add
// microseconds of Python to every call.
TORCH_LIBRARY_IMPL(localargmax, Autograd, m) {
  m.impl("step_frame", torch::autograd::autogradNotImplementedFallback());
  m.impl("merge_frames", torch::autograd::autogradNotImplementedFallback());
  m.impl("log_probs_from_pairs", torch::autograd::autogradNotImplementedFallback());
}

namespace localargmax::cpu {
int64_t parallel_workers(int64_t n);  // cpu/shard_argmax_cpu.cpp
void set_scalar_epilogue(bool on);     // cpu/shard_argmax_cpu.cpp
bool scalar_epilogue();
const char* brgemm_mode(at::ScalarType dtype);  // cpu/shard_argmax_brgemm.cpp
}

// localargmax._C._parallel_workers(n) -> int: distinct threads that ran the
// CPU kernel's at::parallel_for over n work items (a build check, see tests).
static PyObject* py_parallel_workers(PyObject*, PyObject* arg) {
  const long long n = PyLong_AsLongLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  if (n < 1) {
    PyErr_SetString(PyExc_ValueError, "_parallel_workers: n must be >= 1");
    return nullptr;
  }
  return PyLong_FromLongLong(localargmax::cpu::parallel_workers(n));
}

// A weight dtype by name ("float32", "bfloat16", "float16") into *out; false
// with a ValueError set (naming fn) for any other name.
static bool weight_dtype_named(const char* fn, const char* name, at::ScalarType* out) {
  const std::string dtype = name;
  if (dtype == "float32" || dtype == "bfloat16" || dtype == "float16") {
    *out = dtype == "bfloat16" ? at::kBFloat16 : dtype == "float16" ? at::kHalf : at::kFloat;
    return true;
  }
  PyErr_Format(PyExc_ValueError, "%s: dtype must be 'float32', 'bfloat16' or 'float16', got '%s'", fn, name);
  return false;
}

// localargmax._C._cpu_path(path, flags=None, dtype=None) -> str: the CPU path
// the ops' `path` runs on a CPU with `flags` (space-separated /proc/cpuinfo
// names; None: this CPU) for weights of `dtype` ("float32", "bfloat16",
// "float16"; None: float32), from csrc/cpu/cpu_path.h; ValueError as the ops
// raise it.
static PyObject* py_cpu_path(PyObject*, PyObject* args) {
  const char* path = nullptr;
  const char* flags = nullptr;
  const char* dtype = nullptr;
  if (!PyArg_ParseTuple(args, "s|zz", &path, &flags, &dtype)) return nullptr;
  at::ScalarType t = at::kFloat;
  if (dtype != nullptr && !weight_dtype_named("_cpu_path", dtype, &t)) return nullptr;
  using localargmax::cpu::WeightDtype;
  const WeightDtype weight_dtype =
      t == at::kBFloat16 ? WeightDtype::kBFloat16 : t == at::kHalf ? WeightDtype::kFloat16 : WeightDtype::kFloat32;
  try {
    const localargmax::cpu::CpuFeatures features = flags == nullptr ? localargmax::cpu::detect_cpu_features()
                                                                    : localargmax::cpu::parse_cpu_features(flags);
    return PyUnicode_FromString(localargmax::cpu::choose_cpu_path(path, features, weight_dtype).c_str());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    return nullptr;
  }
}

// localargmax._C._brgemm_mode(dtype) -> str: how the brgemm CPU path runs
// for weights of dtype ("float32", "bfloat16", "float16") on this CPU:
// "amx", "vnni" or "plain" (cpu/shard_argmax_brgemm.h).
static PyObject* py_brgemm_mode(PyObject*, PyObject* arg) {
  const char* name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : nullptr;
  if (name == nullptr) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "_brgemm_mode: dtype must be a str");
    return nullptr;
  }
  at::ScalarType t = at::kFloat;
  if (!weight_dtype_named("_brgemm_mode", name, &t)) return nullptr;
  return PyUnicode_FromString(localargmax::cpu::brgemm_mode(t));
}

// localargmax._C._brgemm_epilogue(on) -> bool (the previous setting):
// benchmark only (bench/cpu_paths.py --epilogue-share): False makes
// path="brgemm" skip its epilogue (emit_block), so a call times the tiles
// alone and returns empty keys; process-wide.
// A process-wide switch set from Python's truth of arg; returns the previous setting.
static PyObject* set_switch(PyObject* arg, bool (*get)(), void (*set)(bool)) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  const bool was = get();
  set(on != 0);
  return PyBool_FromLong(was);
}

// localargmax._C._brgemm_calls() -> int: tests only; the cpublas::brgemm
// calls path='brgemm' made since the last reading (which starts it again).
static PyObject* py_brgemm_calls(PyObject*, PyObject*) {
  return PyLong_FromLongLong(static_cast<long long>(localargmax::cpu::brgemm_calls()));
}

static PyObject* py_brgemm_epilogue(PyObject*, PyObject* arg) {
  return set_switch(arg, localargmax::cpu::brgemm_epilogue, localargmax::cpu::set_brgemm_epilogue);
}

// localargmax._C._scalar_epilogue(on) -> bool (the previous setting): tests
// only: True makes the CPU ops' epilogue the scalar emit of every logit (no
// screen, no vectorised log-partition), the reference of the fast one;
// process-wide.
static PyObject* py_scalar_epilogue(PyObject*, PyObject* arg) {
  return set_switch(arg, localargmax::cpu::scalar_epilogue, localargmax::cpu::set_scalar_epilogue);
}

// localargmax._C._brgemm_block(batch, hidden_size, amx, force=None) -> (m, n, step):
// the block (weight rows x batch rows, in `step` cpublas::brgemm calls of
// every step-th row) the brgemm path takes for a call of `batch` rows of
// `hidden_size` with (amx) or without AMX: the rule, or the block forced.
// force=(m, n) or (m, n, step): tests only, every brgemm call then takes it
// (m, n 16, 32 or 64; step 1, 2 or 4, m / step >= 16; (0, 0): the rule
// again), process-wide; TypeError for a force that is not a tuple of two or
// three ints, ValueError for other values.
static PyObject* py_brgemm_block(PyObject*, PyObject* args) {
  long long batch = 0, hidden_size = 0;
  int amx = 0;
  PyObject* force = Py_None;
  if (!PyArg_ParseTuple(args, "LLp|O", &batch, &hidden_size, &amx, &force)) return nullptr;
  if (force != Py_None) {
    long long m = 0, n = 0, step = 1;
    if (!PyTuple_Check(force) || (PyTuple_Size(force) != 2 && PyTuple_Size(force) != 3)) {
      PyErr_SetString(PyExc_TypeError, "_brgemm_block: force must be None or a tuple (m, n) or (m, n, step)");
      return nullptr;
    }
    if (!PyArg_ParseTuple(force, "LL|L", &m, &n, &step)) return nullptr;
    try {
      localargmax::cpu::set_brgemm_block(m, n, step);
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
      return nullptr;
    }
  }
  const localargmax::cpu::BrgemmBlock b = localargmax::cpu::brgemm_block_in_use(batch, hidden_size, amx != 0);
  return Py_BuildValue("LLL", static_cast<long long>(b.m), static_cast<long long>(b.n), static_cast<long long>(b.step));
}

// localargmax._C._fma_peak(isa, iters) -> float: float32 FLOP/s of a tight
// FMA loop ("avx512": zmm, "avx2": ymm; "avx512_bf16": vdpbf16ps, two FLOPs per
// bf16 product; cpu/shard_argmax_tiles.h), for
// bench/cpu_paths.py's fraction of peak; ValueError where the CPU lacks it.
static PyObject* py_fma_peak(PyObject*, PyObject* args) {
  const char* isa = nullptr;
  long long iters = 0;
  if (!PyArg_ParseTuple(args, "sL", &isa, &iters)) return nullptr;
  const std::string name = isa;
  if (name == "avx512" && __builtin_cpu_supports("avx512f"))
    return PyFloat_FromDouble(localargmax::cpu::fma_peak_avx512(iters));
  if (name == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return PyFloat_FromDouble(localargmax::cpu::fma_peak_avx2(iters));
  if (name == "avx512_bf16" && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw"))
    return PyFloat_FromDouble(localargmax::cpu::dpbf16_peak(iters));
  PyErr_Format(PyExc_ValueError, "_fma_peak: '%s' is not an FMA ISA this CPU has (avx512, avx2, avx512_bf16)", isa);
  return nullptr;
}

// localargmax._C._cpu_paths() -> tuple of (name, needs, bit_exact, inner_loop):
// the CPU paths of cpu/cpu_path.h in listing order (needs: /proc/cpuinfo names).
static PyObject* py_cpu_paths(PyObject*, PyObject*) {
  const auto& specs = localargmax::cpu::cpu_paths();
  PyObject* rows = PyTuple_New(static_cast<Py_ssize_t>(specs.size()));
  if (rows == nullptr) return nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* needs = PyTuple_New(static_cast<Py_ssize_t>(specs[i].needs.size()));
    if (needs == nullptr) {
      Py_DECREF(rows);
      return nullptr;
    }
    for (size_t j = 0; j < specs[i].needs.size(); ++j) PyTuple_SET_ITEM(needs, j, PyUnicode_FromString(specs[i].needs[j]));
    PyObject* row = Py_BuildValue("(sNOs)", specs[i].name, needs, specs[i].bit_exact ? Py_True : Py_False,
                                  specs[i].inner_loop);
    if (row == nullptr) {
      Py_DECREF(rows);
      return nullptr;
    }
    PyTuple_SET_ITEM(rows, static_cast<Py_ssize_t>(i), row);
  }
  return rows;
}

// localargmax._C._mma_configs() -> tuple of tuples: the tensor-core kernel's
// named configs (cuda/mma_configs.h), in table order: (name, nt, mt, wm, wn,
// sk, kc, st, minb, tma, regs90, rows, threads, static_smem, dynamic_smem,
// batch_rows, topk).
static PyObject* py_mma_configs(PyObject*, PyObject*) {
  using localargmax::cuda::kMmaConfigs;
  PyObject* rows = PyTuple_New(localargmax::cuda::kNumMmaConfigs);
  if (rows == nullptr) return nullptr;
  for (int i = 0; i < localargmax::cuda::kNumMmaConfigs; ++i) {
    const auto& c = kMmaConfigs[i];
    PyObject* row = Py_BuildValue("(siiiiiiiiOiiiiiiO)", c.name, c.nt, c.mt, c.wm, c.wn, c.sk, c.kc, c.st, c.minb,
                                  c.tma ? Py_True : Py_False, c.regs90, c.rows(), c.threads(), c.static_smem(),
                                  c.dynamic_smem(), c.batch_rows(), c.topk() ? Py_True : Py_False);
    if (row == nullptr) {
      Py_DECREF(rows);
      return nullptr;
    }
    PyTuple_SET_ITEM(rows, i, row);
  }
  return rows;
}

// localargmax._C._choose_mma_config(hidden_size, num_valid, batch, sm_count,
// smem_limit, tma=False, log_partition=False, topk=False) -> str: the config
// C++ auto runs (cuda/mma_configs.h; tma: the launch runs sm_90 code on an
// sm_90+ device; auto_takes_tma decides with log_partition, as run_mma does).
static PyObject* py_choose_mma_config(PyObject*, PyObject* args) {
  long long hidden_size = 0, num_valid = 0, batch = 0;
  int sm_count = 0, smem_limit = 0, tma = 0, log_partition = 0, topk = 0;
  if (!PyArg_ParseTuple(args, "LLLii|ppp", &hidden_size, &num_valid, &batch, &sm_count, &smem_limit, &tma,
                        &log_partition, &topk))
    return nullptr;
  using localargmax::cuda::auto_takes_tma;
  const int i = localargmax::cuda::choose_mma_config(hidden_size, num_valid, batch, sm_count, smem_limit,
                                                     auto_takes_tma(tma != 0, log_partition != 0), topk != 0);
  return PyUnicode_FromString(localargmax::cuda::kMmaConfigs[i].name);
}

// localargmax._C._choose_cuda_path(half, topk, mma_takes, batch, rows) ->
// "simt" / "mma" / "gemm": the path C++ auto takes on CUDA for a shard of rows
// weight rows (cuda/mma_configs.h), for the plain and the log-partition ops alike.
static PyObject* py_choose_cuda_path(PyObject*, PyObject* args) {
  int half = 0, topk = 0, mma_takes = 0;
  long long batch = 0, rows = 0;
  if (!PyArg_ParseTuple(args, "pppLL", &half, &topk, &mma_takes, &batch, &rows)) return nullptr;
  using localargmax::cuda::Path;
  const Path p = localargmax::cuda::choose_cuda_path(half != 0, topk != 0, mma_takes != 0, batch, rows);
  return PyUnicode_FromString(p == Path::kMma ? "mma" : p == Path::kGemm ? "gemm" : "simt");
}

// `import localargmax._C` loads this library and so runs the registrations.
extern "C" PyObject* PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"_parallel_workers", py_parallel_workers, METH_O, "Threads used by the CPU kernel's parallel_for over n items."},
      {"_cpu_path", py_cpu_path, METH_VARARGS,
       "_cpu_path(path, flags=None, dtype=None) -> str: the CPU path `path` runs with these /proc/cpuinfo flags (None: "
       "this CPU) for weights of dtype ('float32' (None), 'bfloat16', 'float16')."},
      {"_brgemm_mode", py_brgemm_mode, METH_O,
       "_brgemm_mode(dtype) -> 'amx', 'vnni' or 'plain': how the brgemm CPU path runs for dtype on this CPU."},
      {"_brgemm_calls", py_brgemm_calls, METH_NOARGS,
       "_brgemm_calls() -> int: tests only; the cpublas::brgemm calls path='brgemm' made since the last reading "
       "(which starts the count again)."},
      {"_brgemm_epilogue", py_brgemm_epilogue, METH_O,
       "_brgemm_epilogue(on) -> bool: benchmark only; False makes path='brgemm' skip its epilogue (tiles alone, "
       "empty keys). Returns the previous setting."},
      {"_scalar_epilogue", py_scalar_epilogue, METH_O,
       "_scalar_epilogue(on) -> bool: tests only; True makes the CPU ops fold every logit through the scalar "
       "epilogue (no screen, no vectorised log-partition). Returns the previous setting."},
      {"_brgemm_block", py_brgemm_block, METH_VARARGS,
       "_brgemm_block(batch, hidden_size, amx, force=None) -> (m, n, step): the brgemm path's block for `batch` "
       "rows of `hidden_size`, in `step` calls of every step-th row; force=(m, n) or (m, n, step) (tests only) "
       "makes every call take it ((0, 0): the rule)."},
      {"_fma_peak", py_fma_peak, METH_VARARGS, "Float32 FLOP/s of a tight FMA loop (isa, iters)."},
      {"_cpu_paths", py_cpu_paths, METH_NOARGS,
       "_cpu_paths() -> the CPU paths: (name, needs, bit_exact, inner_loop) per path, in listing order."},
      {"_choose_mma_config", py_choose_mma_config, METH_VARARGS,
       "_choose_mma_config(hidden_size, num_valid, batch, sm_count, smem_limit, tma=False, log_partition=False, "
       "topk=False) -> the config C++ auto runs (tma: sm_90 code on an sm_90+ device)."},
      {"_choose_cuda_path", py_choose_cuda_path, METH_VARARGS,
       "_choose_cuda_path(half, topk, mma_takes, batch, rows) -> 'simt' / 'mma' / 'gemm': the path C++ auto takes "
       "on CUDA for a shard of `rows` weight rows (the log-partition ops alike)."},
      {"_mma_configs", py_mma_configs, METH_NOARGS,
       "_mma_configs() -> the tensor-core kernel's named configs: (name, nt, mt, wm, wn, sk, kc, st, minb, tma, "
       "regs90, rows, threads, static_smem, dynamic_smem, batch_rows, topk) per row."},
      {nullptr, nullptr, 0, nullptr}};
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
#ifdef LOCALARGMAX_WITH_CUDA
  const long with_cuda = 1;
#else
  const long with_cuda = 0;
#endif
  // localargmax._C.WITH_CUDA: whether this build compiled the CUDA kernels.
  // localargmax._C.TORCH_VERSION: torch.__version__ of the torch this build compiled against.
  if (PyModule_AddIntConstant(module, "WITH_CUDA", with_cuda) != 0 ||
      PyModule_AddStringConstant(module, "TORCH_VERSION", LOCALARGMAX_TORCH_VERSION) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
