"""Launch rules the host emulation checks before any GPU does. The
shared-memory opt-in, as a GPU enforces it: a
block whose static + dynamic shared memory exceeds 48 KiB is refused
("invalid argument") unless the kernel's MaxDynamicSharedMemorySize was
raised. The launchers opt in by ``needs_smem_opt_in`` (static + dynamic); the
rule they replaced looked at the dynamic bytes alone and let variant 10
(49,152 dynamic + 2,048 static) be refused on every GPU."""

from __future__ import annotations

import re

import pytest

from tests.support import emulation
from tests.support.emulation import CSRC

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")
KIB = 1024


@pytest.mark.parametrize(
    "static,dynamic",
    [(2 * KIB, 48 * KIB), (2 * KIB, 47 * KIB), (0, 48 * KIB + 16), (8 * KIB, 100 * KIB), (0, 48 * KIB), (0, 0)],
)
def test_launcher_rule_launches_what_a_gpu_takes(emu, static, dynamic):
    """Through the launch functor: every size up to the opt-in limit launches
    (the first two need the opt-in only because of their static bytes)."""
    assert emu.smem_launch(static, dynamic) is None


@pytest.mark.parametrize("static,dynamic", [(2 * KIB, 48 * KIB), (2 * KIB, 47 * KIB), (1, 48 * KIB)])
def test_the_runtime_refuses_past_48_kib_without_the_opt_in(emu, static, dynamic):
    """The emulated runtime on its own: what today's rule (dynamic > 48 KiB)
    would have launched without the opt-in is refused, as the driver does."""
    error = emu.smem_launch(static, dynamic, raw=True)
    assert error is not None and "invalid argument" in error and "48 KiB" in error, error
    assert emu.smem_launch(static, dynamic, raw=True, opt_in=dynamic) is None
    assert emu.smem_launch(static, dynamic, raw=True, opt_in=dynamic - 1) is not None


def test_within_48_kib_needs_no_opt_in(emu):
    assert emu.smem_launch(2 * KIB, 46 * KIB, raw=True) is None
    assert emu.smem_launch(0, 48 * KIB, raw=True) is None


def test_the_cuda_launcher_opts_in_by_the_same_rule():
    """shard_mma.h's launcher and the emulation's call the one rule of
    shard_launch.cuh; the launch passes the table's static bytes."""
    cuda = (CSRC / "cuda" / "shard_mma.h").read_text()
    emu_src = (CSRC / "emu" / "emu_kernels.cpp").read_text()
    launch = (CSRC / "cuda" / "shard_launch.cuh").read_text()
    assert re.search(r"if \(needs_smem_opt_in\(smem\)\) allow_dynamic_smem\(", cuda)
    assert re.search(r"if \(needs_smem_opt_in\(smem\)\) emu::set_max_dynamic_shared\(", emu_src)
    assert "DynamicSmem{C.dynamic_smem(), C.static_smem()}" in launch
    assert "48 * 1024" not in cuda, "an opt-in threshold of its own in the CUDA launcher"


@pytest.mark.parametrize(
    "ptx,binary,major,want",
    [
        (90, 90, 9, True),  # sm_90a SASS on an H100 / H200
        (90, 100, 10, True),  # sm_90a-compatible code on sm_100 (the older arch counts)
        (100, 100, 10, True),
        (80, 90, 9, False),  # an sm_80-only build JIT-compiled from compute_80 PTX on an H200
        (80, 80, 8, False),  # an A100
        (90, 90, 8, False),  # code for 9.0 cannot run on 8.x: refused however it got there
        (0, 90, 9, True),  # attributes without a PTX version: the binary decides
        (0, 0, 9, False),  # nothing known: no PDL, no TMA
    ],
)
def test_pdl_and_tma_follow_the_loaded_code_not_the_device(emu, ptx, binary, major, want):
    """launch_features: a pure function of the loaded kernel's cudaFuncAttributes
    (ptxVersion, binaryVersion) and the device, used by the CUDA launcher."""
    assert emu.launch_features(ptx, binary, major) == {"pdl": want, "tma": want}


def test_the_cuda_launcher_takes_pdl_and_tma_from_the_kernel():
    cuda = (CSRC / "cuda" / "shard_mma.h").read_text()
    assert "launch_features(attr.ptxVersion, attr.binaryVersion, major)" in cuda
    assert "kernel_features(reinterpret_cast<const void*>(kernel), device, major).pdl" in cuda
    assert "kernel_features(kernel, device, major).tma" in cuda
