"""The build: the seven ops registered (schemas, CPU and CUDA kernels, fake
kernels), the CUDA build checked without a GPU (sm_90a machine code, no
spills, HMMA in the tensor-core kernel), and the CPU kernel running on
torch's OpenMP threads (a build without -fopenmp runs at::parallel_for on the
calling thread, silently; these tests fail on such a build)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch

import localargmax
from localargmax import _C
from localargmax._validation import MMA_CONFIGS

SCHEMAS = {
    "shard_argmax": "localargmax::shard_argmax(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    'int num_valid, str path="auto") -> Tensor',
    "shard_topk": "localargmax::shard_topk(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    'int num_valid, int k, str path="auto") -> Tensor',
    "shard_sample": "localargmax::shard_sample(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    'int num_valid, Tensor temperature, int seed, int offset, str path="auto", Tensor? noise_seed=None, '
    "Tensor? noise_pos=None) -> Tensor",
    "merge_keys": "localargmax::merge_keys(Tensor keys, Tensor? d2t) -> (Tensor, Tensor)",
    "shard_argmax_lse": "localargmax::shard_argmax_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    'int num_valid, float scale=1., float soft_cap=0., str path="auto", Tensor? temperature=None) '
    "-> (Tensor, Tensor)",
    "shard_topk_lse": "localargmax::shard_topk_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    'int num_valid, int k, float scale=1., float soft_cap=0., str path="auto") -> (Tensor, Tensor)',
    "shard_sample_lse": "localargmax::shard_sample_lse(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, "
    "int num_valid, Tensor temperature, int seed, int offset, float scale=1., float soft_cap=0., "
    'str path="auto", Tensor? noise_seed=None, Tensor? noise_pos=None) -> (Tensor, Tensor)',
}
needs_cuda_build = pytest.mark.skipif(
    not localargmax.WITH_CUDA, reason="built without CUDA (torch CPU-only, nvcc not found, or LOCALARGMAX_CUDA=0)"
)


@pytest.mark.parametrize("op", list(SCHEMAS))
def test_op_schema_and_kernels(op):
    """The schemas of csrc/ops.cpp (integer outputs, no aliasing, no mutation),
    a CPU kernel, and a CUDA kernel exactly when the build says WITH_CUDA."""
    assert str(getattr(torch.ops.localargmax, op).default._schema) == SCHEMAS[op]
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"localargmax::{op}", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"localargmax::{op}", "CUDA") == localargmax.WITH_CUDA
    assert isinstance(localargmax.WITH_CUDA, bool)


def test_fake_kernels_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        hidden, weight = torch.empty(9, 16, dtype=torch.bfloat16), torch.empty(128, 16, dtype=torch.bfloat16)
        keys = torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 100)
        assert keys.shape == (9,) and keys.dtype == torch.int64
        assert torch.ops.localargmax.shard_topk.default(hidden, weight, None, 0, 100, 5).shape == (9, 5)
        assert torch.ops.localargmax.shard_sample.default(hidden, weight, None, 0, 100, torch.ones(9), 1, 0).shape == (
            9,
        )
        ids, values = torch.ops.localargmax.merge_keys.default(torch.empty(4, 9, dtype=torch.int64), None)
        assert ids.shape == values.shape == (9,) and ids.dtype == torch.int64 and values.dtype == torch.float32
        with pytest.raises(ValueError, match="num_valid"):  # the fake kernel checks arguments too
            torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 129)
        for keys, pairs in (
            torch.ops.localargmax.shard_argmax_lse.default(hidden, weight, None, 0, 100),
            torch.ops.localargmax.shard_topk_lse.default(hidden, weight, None, 0, 100, 5, 2.0, 3.0),
            torch.ops.localargmax.shard_sample_lse.default(hidden, weight, None, 0, 100, torch.ones(9), 1, 0),
        ):
            assert keys.shape[0] == 9 and keys.dtype == torch.int64
            assert pairs.shape == (9, 2) and pairs.dtype == torch.float32
        with pytest.raises(ValueError, match="scale"):
            torch.ops.localargmax.shard_argmax_lse.default(hidden, weight, None, 0, 100, 0.0)


def _cuobjdump(*args):
    """Run cuobjdump (CUDA toolkit, PATH, or the Triton wheel torch brings) on the library."""
    candidates = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    tool = next((c for c in candidates if c and Path(c).exists()), None)
    if tool is None:
        pytest.fail("WITH_CUDA build but no cuobjdump found (CUDA toolkit bin/, PATH, or triton's bundled copy)")
    return subprocess.run([tool, *args, _C.__file__], capture_output=True, text=True, check=True).stdout


@needs_cuda_build
def test_library_carries_sm90a_machine_code():
    out = _cuobjdump("--list-elf")
    assert "sm_90a" in set(re.findall(r"\.(sm_\w+)\.cubin", out)), f"no sm_90a cubin in {_C.__file__}: {out}"


@needs_cuda_build
def test_hot_kernels_use_no_local_memory():
    out = _cuobjdump("--dump-resource-usage")
    usage = re.findall(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    families = [
        "shard_argmax_kernel",
        "shard_argmax_mma_pipe_kernel",
        "shard_topk_mma_pipe_kernel",
        "logits_to_keys_kernel",
        "merge_keys_kernel",
        "merge_partition_kernel",
    ]
    missing = [f for f in families if not any(f in u[0] for u in usage)]
    assert not missing, f"kernels missing from the resource usage dump: {missing}\n{out[:2000]}"
    bad = [(n, s, lo) for n, _, s, lo in usage if any(f in n for f in families) and (int(s) or int(lo))]
    assert not bad, f"kernels with stack frames / local memory (spills): {bad}"


@needs_cuda_build
def test_mma_kernel_runs_on_tensor_cores():
    """The sm_90a code of the tensor-core kernel holds HMMA instructions (and
    the CUDA-core kernel none): mma.sync compiled to tensor-core instructions."""
    functions = re.split(r"\n\s*Function : ", _cuobjdump("--dump-sass", "--gpu-architecture", "sm_90a"))
    mma = [f for f in functions if re.search(r"shard_(argmax|topk)_mma_pipe_kernel", f.split("\n", 1)[0])]
    simt = [f for f in functions if "shard_argmax_kernel" in f.split("\n", 1)[0]]
    assert mma and all("HMMA" in f for f in mma), "a tensor-core kernel instantiation has no HMMA instruction"
    assert any("shard_topk_mma_pipe_kernel" in f.split("\n", 1)[0] for f in mma), "no top-k tensor-core kernel"
    assert simt and not any("HMMA" in f for f in simt)


# The mangled name of a TMA instantiation: ...ELi<MINB>ELb1EEEv... (shard_argmax_mma_pipe_kernel<..., true>)
_TMA_SUFFIX_RE = re.compile(r"Lb1EEEv")
_TMA_SUFFIX = "<tma>"


def _sass_functions(arch: str) -> dict[str, str]:
    """Mangled kernel name -> its SASS, for one architecture of the library."""
    chunks = re.split(r"\n\s*Function : ", _cuobjdump("--dump-sass", "--gpu-architecture", arch))[1:]
    named = {c.split("\n", 1)[0].strip(): c for c in chunks}
    # (the pipelined TMA instantiations are marked by a suffix: tests pick them by name)
    return {n + (_TMA_SUFFIX if _TMA_SUFFIX_RE.search(n) else ""): c for n, c in named.items()}


@needs_cuda_build
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_pipelined_mma_kernel_streams_by_cp_async(arch):
    """The pipelined tensor-core kernel's machine code holds what it was
    written for, on each architecture the build carries: LDGSTS (cp.async),
    LDGDEPBAR / DEPBAR (commit / wait groups), HMMA; and on sm_90a the
    programmatic-dependent-launch wait (griddepcontrol.wait: ACQBULK, seen
    next to PREEXIT for launch_dependents in nvcc 13.0's sm_90a code)."""
    if arch not in set(re.findall(r"\.(sm_\w+)\.cubin", _cuobjdump("--list-elf"))):
        pytest.skip(f"this build carries no {arch} code (LOCALARGMAX_CUDA_ARCH)")
    pipe = {n: f for n, f in _sass_functions(arch).items() if "shard_argmax_mma_pipe_kernel" in n}
    want = 2 * len(MMA_CONFIGS)  # one build per config and dtype (the cp.async ones carry the log-partition)
    assert len(pipe) == want, f"{len(pipe)} tensor-core instantiations in the {arch} code ({want // 2} x 2 dtypes)"
    for name, sass in pipe.items():
        if name.endswith(_TMA_SUFFIX) and arch == "sm_80":  # the TMA wrappers trap below sm_90 (never launched)
            assert re.search(r"\bBPT\.TRAP\b", sass) and not re.search(r"\bUTMALDG\b", sass), name
            continue
        # LDGSTS: the hidden rows (and the weight but for TMA) by cp.async in every config
        wanted = ["LDGSTS", "LDGDEPBAR", "DEPBAR", "HMMA"] + (["ACQBULK"] if arch == "sm_90a" else [])
        missing = [op for op in wanted if not re.search(rf"\b{op}\b", sass)]
        assert not missing, f"{name} ({arch}) lacks {missing}"
        tma_ops = ["UTMALDG", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "FENCE.VIEW.ASYNC.S"]
        found = [op for op in tma_ops if re.search(rf"\b{re.escape(op)}\b", sass)]
        if name.endswith(_TMA_SUFFIX) and arch == "sm_90a":
            # the bulk tensor copy (cp.async.bulk.tensor.2d: UTMALDG), the mbarrier's arrive.expect_tx and
            # try_wait.parity (SYNCS...), fence.proxy.async (FENCE.VIEW.ASYNC.S)
            assert found == tma_ops, f"{name} ({arch}) lacks {sorted(set(tma_ops) - set(found))}"
        elif not name.endswith(_TMA_SUFFIX):
            assert not found, f"{name} ({arch}): a cp.async config holds {found}"


@needs_cuda_build
def test_pipelined_mma_kernel_fits_its_blocks_per_sm():
    """Each config's MINB blocks (__launch_bounds__) fit on an SM by
    registers (65536 per SM) and by shared memory (228 KiB per SM; SHARED here
    is the static block_best plus the 1 KiB the system reserves per block, the
    stages are dynamic: ST * KC * (rows + 8 NT) * 64 bytes), its static arrays
    under the 48 KiB static limit and static + dynamic under the 227 KiB
    opt-in limit of sm_90 (the table's static_smem / dynamic_smem, as _C
    exports them); 4+ blocks of 128 threads mean at most 128 registers. Prints
    each config's registers and shared memory (sm_90a)."""
    out = _cuobjdump("--dump-resource-usage", "--gpu-architecture", "sm_90a")
    usage = re.findall(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    # mangled template arguments: ...ILi<NT>ELi<MT>ELi<WM>ELi<WN>ELi<SK>ELi<KC>ELi<ST>ELi<MINB>ELb<TMA>EEEv...
    by_template = {(tuple(m[1:9]), m.tma): m for m in MMA_CONFIGS.values()}
    pipe = []
    for name, reg, stack, shared, local in usage:
        if "shard_argmax_mma_pipe_kernel" in name:
            shared = int(shared)
            template = tuple(map(int, re.findall(r"Li(\d+)E", name)[-8:]))
            tma = re.findall(r"Lb([01])E", name)[-1] == "1"
            nt, mt, wm, wn, sk, kc, st, minb = template
            dynamic = st * kc * (wm * mt * 16 + 8 * nt * wn) * 64 + (8 * st if tma else 0)  # + the TMA mbarriers
            m = by_template.get((template, tma))
            assert m is not None and m.dynamic_smem == dynamic, name
            assert m.static_smem == shared - 1024, name  # (the log-partition's warp states live in the stages)
            assert int(stack) == 0 and int(local) == 0, name  # no spills (also test_hot_kernels_use_no_local_memory)
            pipe.append((f"mma/{m.name} {name}", int(reg), shared, dynamic, wm * wn * sk * 32, minb))
    # each config, for bf16 and fp16 (one build: a cp.async one also runs the log-partition)
    assert len(pipe) == 2 * len(MMA_CONFIGS), out[:2000]
    for name, reg, shared, dynamic, threads, minb in pipe:
        print(f"{name}: REG {reg} SHARED {shared} + {dynamic} dynamic, threads {threads} min blocks/SM {minb}")
        assert shared - 1024 <= 48 * 1024 and shared - 1024 + dynamic <= 227 * 1024, name
        assert minb * (shared + dynamic) <= 228 * 1024, name
        assert minb * threads * ((reg + 7) // 8 * 8) <= 65536, name


@pytest.fixture
def num_threads():
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_for_uses_torch_threads(num_threads, threads):
    num_threads(threads)
    assert _C._parallel_workers(64) == threads  # OpenMP starts exactly `threads` workers whatever the core count
    assert _C._parallel_workers(1) == 1


def test_parallel_workers_rejects_bad_n():
    with pytest.raises(ValueError, match="n must be >= 1"):
        _C._parallel_workers(0)


def test_kernel_called_from_many_python_threads(num_threads, gen):
    """Several Python threads calling the op at once (each opens its own OpenMP
    region) give the same keys as one call."""
    num_threads(2)
    hidden, weight = torch.randn(3, 64, generator=gen), torch.randn(4096, 64, generator=gen)
    expected = localargmax.shard_argmax(hidden, weight)
    results = [None] * 4

    def work(i):
        results[i] = localargmax.shard_argmax(hidden, weight)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, expected) for r in results)


def test_import_refuses_a_build_for_another_torch():
    """``_C`` records the torch it was compiled against; importing it under
    another torch (vLLM's pin replaced ours, say) raises ImportError naming
    both versions and the rebuild command, instead of crashing later."""
    import sys

    assert _C.TORCH_VERSION == torch.__version__
    code = "import torch; torch.__version__ = '0.0.1+other'; import localargmax"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), proc.stderr[-2000:]
    for words in (_C.TORCH_VERSION, "0.0.1+other", "pip install --no-build-isolation -e ."):
        assert words in last, last
