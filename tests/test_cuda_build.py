"""The CUDA build, checked without a GPU: the kernels are registered, the
library carries sm_90a machine code, and no hot kernel spills to local memory
(ptxas/cuobjdump resource usage). Skipped, saying why, when the build had no
CUDA (a CPU-only torch, no nvcc, or LOCALARGMAX_CUDA=0)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import localargmax
import localargmax._C as _C

needs_cuda_build = pytest.mark.skipif(
    not localargmax.WITH_CUDA,
    reason="built without CUDA (torch CPU-only, nvcc not found, or LOCALARGMAX_CUDA=0)",
)


def _cuobjdump():
    """cuobjdump from the CUDA toolkit, PATH, or the Triton wheel torch brings."""
    candidates = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).exists():
            return c
    pytest.fail("WITH_CUDA build but no cuobjdump found (CUDA toolkit bin/, PATH, or triton's bundled copy)")


@needs_cuda_build
@pytest.mark.parametrize("op", ["shard_argmax", "merge_keys"])
def test_cuda_kernel_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"localargmax::{op}", "CUDA")


@needs_cuda_build
def test_library_carries_sm90a_machine_code():
    out = subprocess.run([_cuobjdump(), "--list-elf", _C.__file__], capture_output=True, text=True, check=True).stdout
    archs = set(re.findall(r"\.(sm_\w+)\.cubin", out))
    assert "sm_90a" in archs, f"no sm_90a cubin in {_C.__file__}: {out}"


@needs_cuda_build
def test_hot_kernels_use_no_local_memory():
    out = subprocess.run(
        [_cuobjdump(), "--dump-resource-usage", _C.__file__], capture_output=True, text=True, check=True
    ).stdout
    usage = re.findall(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    families = ["shard_argmax_kernel", "shard_argmax_mma_kernel", "logits_to_keys_kernel", "merge_keys_kernel"]
    kernels = [u for u in usage if any(f in u[0] for f in families)]
    missing = [f for f in families if not any(f in u[0] for u in usage)]
    assert not missing, f"kernels missing from the resource usage dump: {missing}\n{out[:2000]}"
    bad = [(name, stack, local) for name, _, stack, local in kernels if int(stack) or int(local)]
    assert not bad, f"kernels with stack frames / local memory (spills): {bad}"


def test_registration_reports_build_flag():
    # WITH_CUDA must agree with what is registered: no silent CPU-only build claiming CUDA.
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("localargmax::shard_argmax", "CUDA")
    assert has_cuda_kernel == localargmax.WITH_CUDA


@needs_cuda_build
def test_mma_kernel_runs_on_tensor_cores():
    """The sm_90a code of the tensor-core kernel holds HMMA instructions (and
    the CUDA-core kernel none), i.e. the mma.sync path really compiled to
    tensor-core instructions for Hopper."""
    out = subprocess.run([_cuobjdump(), "--dump-sass", "--gpu-architecture", "sm_90a", _C.__file__],
                         capture_output=True, text=True, check=True).stdout
    functions = re.split(r"\n\s*Function : ", out)
    mma = [f for f in functions if "shard_argmax_mma_kernel" in f.split("\n", 1)[0]]
    simt = [f for f in functions if "shard_argmax_kernel" in f.split("\n", 1)[0]]
    assert mma, "no shard_argmax_mma_kernel in the sm_90a SASS"
    assert all("HMMA" in f for f in mma), "a shard_argmax_mma_kernel instantiation has no HMMA instruction"
    assert simt and not any("HMMA" in f for f in simt)
