"""Builds tests/cpp/test_mma_fragment.cpp against csrc/common/mma_fragment.h
with g++ and runs it: the tensor-core kernel's register plumbing (which k of
which row goes into which mma.sync register, which logit each accumulator
holds) checked on the CPU against an emulation of mma.sync m16n8k16 written
from the PTX ISA fragment tables. Also run against broken copies of the
header, so the check can fail."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "cpp" / "test_mma_fragment.cpp"
CSRC = ROOT / "csrc"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def _run(include_dir: pathlib.Path, tmp_path: pathlib.Path, seed: int) -> subprocess.CompletedProcess:
    out = tmp_path / "test_mma_fragment"
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include_dir}", str(SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"compiling the C++ unit test failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return subprocess.run([str(out), str(seed)], capture_output=True, text=True, timeout=120)


def test_mma_fragment_cpp(tmp_path, seed):
    proc = _run(CSRC, tmp_path, seed)
    assert proc.returncode == 0 and "OK" in proc.stdout, f"seed {seed}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize(
    "mutation",
    [
        ("{ return reg % 2; }", "{ return reg / 2; }"),  # rows g / g+8 swapped with k halves
        ("return 2 * s + reg / 2;", "return 2 * s + reg % 2;"),  # A words in the wrong k half
        ("return 2 * s + reg; }", "return 2 * (1 - s) + reg; }"),  # B fed from the other mma step
        ("return 2 * (lane % 4) + r % 2;", "return 2 * (lane % 4) + r / 2;"),  # C column misread
        ("return 8 * t + 4 * s + 2 * h + j;", "return 8 * t + 4 * s + h + 2 * j;"),  # wrong k map
    ],
    ids=["a_row_half", "a_word", "b_word", "c_col", "chunk_k"],
)
def test_cpp_test_catches_broken_fragments(tmp_path, mutation):
    old, new = mutation
    header = (CSRC / "common" / "mma_fragment.h").read_text()
    assert old in header, f"mutation anchor {old!r} not found in mma_fragment.h (update this test)"
    shutil.copytree(CSRC / "common", tmp_path / "common")  # with host_device.h
    (tmp_path / "common" / "mma_fragment.h").write_text(header.replace(old, new))
    proc = _run(tmp_path, tmp_path, 1)
    assert proc.returncode != 0, f"the C++ test passed against a broken header ({old!r} -> {new!r})"
