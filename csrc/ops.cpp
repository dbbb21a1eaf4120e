// The whole operator surface of localargmax, in one screen. Each backend
// registers its implementations next to them (cpu/*.cpp, cuda/*.cu).
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(localargmax, m) {
  // hidden [B, H], weight [rows, H], bias [rows]? -> packed keys [B] int64
  // path: which kernel variant runs: "auto", or CPU "generic" | "avx2", CUDA "simt" | "mma" | "gemm"
  // (a forced path that cannot take the inputs raises ValueError; see localargmax/ops.py)
  m.def("shard_argmax(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "str path=\"auto\") -> Tensor");
  // the k largest keys per row, descending (0 = empty slot): [B, k] int64, 1 <= k <= 64
  m.def("shard_topk(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, int k, "
        "str path=\"auto\") -> Tensor");
  // Gumbel-max: key of logit / T + Gumbel(seed, offset + b, global index); T == 0 rows greedy. [B] int64
  m.def("shard_sample(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "Tensor temperature, int seed, int offset, str path=\"auto\") -> Tensor");
  // The same three with the log-partition (DESIGN.md, "Log-probabilities"): every logit is first
  // transformed (soft_cap > 0: tanh(x / soft_cap) * soft_cap; then * scale), the keys carry the
  // transformed values, and per row the second output [B, 2] float32 holds the shard's pair
  // (ref, sum): ref = the value of the row's best key (a sample: its transformed logit), -inf for
  // an empty shard; sum = sum over valid entries of exp((x - ref) / T) (T = 1 unless sampling at T > 0).
  m.def("shard_argmax_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "float scale=1.0, float soft_cap=0.0, str path=\"auto\") -> (Tensor, Tensor)");
  m.def("shard_topk_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, int k, "
        "float scale=1.0, float soft_cap=0.0, str path=\"auto\") -> (Tensor, Tensor)");
  m.def("shard_sample_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        "Tensor temperature, int seed, int offset, float scale=1.0, float soft_cap=0.0, str path=\"auto\") "
        "-> (Tensor, Tensor)");
  // keys [tp, B] or [B] int64, d2t [draft_vocab]? int64 -> (ids [B] int64, values [B] float32)
  m.def("merge_keys(Tensor keys, Tensor? d2t) -> (Tensor, Tensor)");
}

namespace localargmax::cpu {
int64_t parallel_workers(int64_t n);  // cpu/shard_argmax_cpu.cpp
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

// `import localargmax._C` loads this library and so runs the registrations.
extern "C" PyObject* PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"_parallel_workers", py_parallel_workers, METH_O, "Threads used by the CPU kernel's parallel_for over n items."},
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
