"""localargmax.kernel_path (which path serves a weight dtype) and the tests'
knowledge of it (issue 54): on every kind of CPU, faked by its feature set,
auto resolves per dtype as DESIGN.md says, and the exact-problem strategies
plant subnormals exactly where the resolved path keeps them (an AMX Xeon's
bf16 auto is brgemm, whose tiles flush them); on this CPU the documented
properties agree with what the kernels do."""

from __future__ import annotations

import pytest
import torch

import localargmax
from localargmax import _C
from tests.support.paths import (
    CPU_ISA_PATHS,
    bit_identical_to_generic,
    brgemm_mode,
    cpu_path_unavailable,
    flushes_denormals,
)
from tests.support.strategies import EXACT_DTYPES, EXP_RANGE, NORMAL_EXP, exact_problems, given, settings, st

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
AVX2 = "fpu sse4_2 avx avx2 fma f16c bmi2"
AVX512 = AVX2 + " avx512f avx512dq avx512bw avx512vl"
AVX512_BF16 = AVX512 + " avx512_bf16 avx512_vnni"  # this machine's kind (AMD EPYC, Zen 4)
AMX = AVX512_BF16 + " avx512_fp16 amx_tile amx_bf16 amx_int8"  # Sapphire Rapids
FAKE_CPUS = {
    # name: (flags, {dtype: (auto's path, flushes subnormals)}), from DESIGN.md "CPU paths"
    "generic": ("fpu sse4_2", {F32: ("generic", False), BF16: ("generic", False), F16: ("generic", False)}),
    "avx2": (AVX2, {F32: ("avx2", False), BF16: ("avx2", False), F16: ("avx2", False)}),
    "avx512": (AVX512, {F32: ("avx512", False), BF16: ("avx512", False), F16: ("avx512", False)}),
    "avx512_bf16": (AVX512_BF16, {F32: ("avx512", False), BF16: ("avx512_bf16", True), F16: ("avx512", False)}),
    "amx": (AMX, {F32: ("avx512", False), BF16: ("brgemm", True), F16: ("avx512", False)}),
    "amx_fp16": (AMX + " amx_fp16", {F32: ("avx512", False), BF16: ("brgemm", True), F16: ("brgemm", True)}),
}
DTYPE_IDS = {F32: "fp32", BF16: "bf16", F16: "fp16"}


def _proc_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1] for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags on this system")


# ----------------------------------------------------------------------------- the public function


@pytest.mark.parametrize("cpu", [None, *FAKE_CPUS])
def test_kernel_path_is_the_ops_choice(cpu):
    """kernel_path on CPU is the C++ choice the ops make (_C._cpu_path), for
    auto and every named path, every dtype, on this CPU and on fake ones; a
    named path the CPU lacks is the ops' ValueError."""
    flags = None if cpu is None else FAKE_CPUS[cpu][0]
    for name in ("auto", *CPU_ISA_PATHS):
        for dtype in EXACT_DTYPES:
            try:
                want = _C._cpu_path(name, flags, str(dtype).removeprefix("torch."))
            except ValueError as e:
                with pytest.raises(ValueError, match="needs a CPU with .* this CPU lacks"):
                    localargmax.kernel_path(dtype, "cpu", name, cpu_flags=flags)
                assert "this CPU lacks" in str(e)
                continue
            assert localargmax.kernel_path(dtype, "cpu", name, cpu_flags=flags) == want, (name, dtype)
            assert localargmax.kernel_path(dtype, torch.device("cpu"), name, batch=7, cpu_flags=flags) == want
    assert "kernel_path" in localargmax.__all__


@pytest.mark.parametrize("dtype", EXACT_DTYPES, ids=DTYPE_IDS.get)
def test_auto_runs_the_path_kernel_path_names(gen, dtype):
    """On this CPU, path="auto" gives the keys of the path kernel_path names
    (argmax, top-k, sampling; random data, where another path would give
    other bits on some rows)."""
    hidden = torch.randn(9, 70, generator=gen).to(dtype)
    weight = torch.randn(300, 70, generator=gen).to(dtype)
    named = localargmax.kernel_path(dtype)
    for op in (
        lambda p: localargmax.shard_argmax(hidden, weight, path=p),
        lambda p: localargmax.shard_topk(hidden, weight, 5, path=p),
        lambda p: localargmax.shard_sample(hidden, weight, torch.full((9,), 0.8), 3, path=p),
    ):
        assert torch.equal(op("auto"), op(named)), named


def test_kernel_path_on_cuda():
    """CUDA: C++ auto's rule (_C._choose_cuda_path): float32 simt at every
    batch, bf16 / fp16 mma below batch 17 and gemm from it on shards of up to
    2**21 rows (mma past it: cuBLAS's limit); a named path is itself (mma /
    gemm only for 16-bit weights); answered without a GPU."""
    for batch in (0, 1, 16, 17, 32, 33, 65, 4096):
        assert localargmax.kernel_path(F32, "cuda", batch=batch) == "simt"
        for dtype in (BF16, F16):
            want = "gemm" if batch >= 17 else "mma"
            assert (
                localargmax.kernel_path(dtype, "cuda:3", batch=batch)
                == want
                == _C._choose_cuda_path(True, False, True, batch, 151936)
                == localargmax.kernel_path(dtype, "cuda", batch=batch, rows=2**21)
            )
            assert localargmax.kernel_path(dtype, "cuda", batch=batch, rows=2**21 + 1) == "mma"
            assert _C._choose_cuda_path(True, False, False, batch, 2**21 + 1) == "simt"
    for batch in (None, 1, 17, 256):  # top-k: mma at every batch for 16-bit weights (no batch needed), no gemm
        assert localargmax.kernel_path(BF16, "cuda", batch=batch, op="topk") == "mma"
        assert localargmax.kernel_path(F32, "cuda", batch=batch, op="topk") == "simt"
    with pytest.raises(ValueError, match="gemm.*top-k"):
        localargmax.kernel_path(BF16, "cuda", "gemm", op="topk")
    with pytest.raises(ValueError, match="op must be"):
        localargmax.kernel_path(BF16, "cuda", op="lse")
    assert localargmax.kernel_path(F32, "cuda") == "simt"  # float32: no batch needed
    for name in ("simt", "mma", "gemm"):
        assert localargmax.kernel_path(BF16, "cuda", name) == name
    assert localargmax.kernel_path(F32, "cuda", "simt") == "simt"


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.int8,), {}, "dtype must be torch.float32, torch.bfloat16 or torch.float16, got torch.int8"),
        (("bfloat16",), {}, "dtype must be torch.float32"),
        ((None,), {}, "dtype must be torch.float32"),
        ((BF16, "mps"), {}, "device must be 'cpu' or 'cuda'"),
        ((BF16, "nonsense"), {}, "device must be 'cpu' or 'cuda'"),
        ((BF16, 3), {}, "device must be 'cpu' or 'cuda'"),
        ((BF16, "cpu", "mma"), {}, "path must be one of .* on cpu, got 'mma'"),
        ((BF16, "cpu", "AVX2"), {}, "path must be one of"),
        ((BF16, "cpu", None), {}, "path must be one of"),
        ((BF16, "cuda", "avx512"), {}, "path must be one of .* on cuda, got 'avx512'"),
        ((BF16, "cpu", "avx512_bf16"), {"cpu_flags": AVX2}, "path='avx512_bf16' needs a CPU with .* this CPU lacks"),
        ((BF16, "cpu"), {"batch": -1}, r"batch must be None or an int in \[0, 2\*\*63\), got -1"),
        ((BF16, "cpu"), {"batch": 2.0}, "batch must be None or an int in"),
        ((BF16, "cpu"), {"batch": True}, "batch must be None or an int in"),
        ((BF16, "cuda"), {"batch": 8, "rows": -1}, r"rows must be None or an int in \[0, 2\*\*63\), got -1"),
        ((BF16, "cuda"), {"batch": 8, "rows": 2.0}, "rows must be None or an int in"),
        ((BF16, "cuda"), {"batch": 32, "rows": 2**70}, "rows must be None or an int in"),
        ((BF16, "cuda"), {"batch": 2**70}, "batch must be None or an int in"),
        ((BF16, "cuda", "gemm"), {"batch": 32, "rows": 2**21 + 1}, "path='gemm' takes shards of at most 2"),
        ((BF16, "cpu"), {"cpu_flags": ["avx2"]}, "cpu_flags must be None or a space-separated str"),
        ((BF16, "cuda"), {"batch": 8, "cpu_flags": AMX}, "cpu_flags is for device='cpu' only"),
        ((BF16, "cuda"), {}, "depends on the batch .* pass batch="),
        ((F16, "cuda", "auto"), {}, "pass batch="),
        ((F32, "cuda", "mma"), {}, "path='mma' needs bfloat16 or float16 weights"),
        ((F32, "cuda", "gemm"), {}, "path='gemm' needs bfloat16 or float16 weights"),
    ],
)
def test_kernel_path_refuses_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        localargmax.kernel_path(*args, **kwargs)


# ----------------------------------------------------------------------------- the tests' knowledge of auto


@pytest.mark.parametrize("cpu", list(FAKE_CPUS))
@pytest.mark.parametrize("dtype", EXACT_DTYPES, ids=DTYPE_IDS.get)
def test_strategies_follow_the_resolved_paths_flush_property(cpu, dtype):
    """For every kind of CPU (a fake feature set) and dtype: auto resolves to
    DESIGN.md's path, flushes_denormals and bit_identical_to_generic say that
    path's documented properties, and the exact problems' strategy plants
    subnormal inputs and products exactly where the path keeps them: it
    finds one where it does, and every drawn problem has only normal
    nonzero inputs and products where the path flushes them (an AMX Xeon's
    bf16)."""
    hypothesis = pytest.importorskip("hypothesis")
    flags, table = FAKE_CPUS[cpu]
    path, flushes = table[dtype]
    assert localargmax.kernel_path(dtype, cpu_flags=flags) == path
    assert flushes_denormals("auto", dtype, flags) == flushes
    assert bit_identical_to_generic("auto", dtype, flags) == (path in ("generic", "avx2", "avx512"))
    strategy = exact_problems(cpu_flags=flags).filter(lambda p: p.weight.dtype == dtype)
    every_check = list(hypothesis.HealthCheck)
    search = settings(max_examples=3000, database=None, suppress_health_check=every_check)
    smallest = 2.0 ** NORMAL_EXP[dtype]

    def subnormal(p):
        h, w = p.hidden.double().abs(), p.weight.double().abs()
        h, w = h[(h > 0) & h.isfinite()], w[(w > 0) & w.isfinite()]
        if not len(h) or not len(w):
            return False
        return bool((h < smallest).any() or (w < smallest).any() or h.min() * w.min() < 2.0**-126)

    if not flushes:
        found = hypothesis.find(strategy, subnormal, settings=search)  # raises NoSuchExample if it never plants them
        assert found.hidden.dtype == dtype
        assert EXP_RANGE[dtype][0] < NORMAL_EXP[dtype]
        return

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=every_check)
    @given(p=strategy)
    def no_subnormals(p):
        assert not subnormal(p), p

    no_subnormals()


def test_brgemm_mode_of_the_flags_is_atens_on_this_cpu():
    """The documented brgemm modes derived from a feature set
    (tests.support.paths.brgemm_mode) agree with ATen's own answer on this
    CPU, given this CPU's /proc/cpuinfo flags; so do both flush properties,
    path by path."""
    flags = _proc_flags()
    for dtype in EXACT_DTYPES:
        assert brgemm_mode(dtype, flags) == brgemm_mode(dtype), dtype
        for name in ("auto", *CPU_ISA_PATHS):
            if cpu_path_unavailable(name) is None:
                assert flushes_denormals(name, dtype, flags) == flushes_denormals(name, dtype), (name, dtype)
                assert bit_identical_to_generic(name, dtype, flags) == bit_identical_to_generic(name, dtype)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_exact_problems_for_a_named_path(data):
    """exact_problems(path=NAME) follows a named path's own property on this
    CPU: where it flushes (avx512_bf16's vdpbf16ps for bf16; brgemm where
    ATen runs a VNNI B) no subnormal inputs are drawn."""
    name = data.draw(st.sampled_from([n for n in ("avx512_bf16", "brgemm") if cpu_path_unavailable(n) is None]))
    p = data.draw(exact_problems(path=name))
    dtype = p.weight.dtype
    if flushes_denormals(name, dtype):
        for t in (p.hidden, p.weight):
            finite = t.double().abs()[t.isfinite() & (t != 0)]
            assert bool((finite >= 2.0 ** NORMAL_EXP[dtype]).all()), p
