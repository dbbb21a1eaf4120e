"""Builds tests/cpp/test_packed_key.cpp against csrc/common/packed_key.h with
g++ and runs it (DESIGN.md table, ordering and round-trip properties)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "cpp" / "test_packed_key.cpp"
CSRC = ROOT / "csrc"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def _build(include_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include_dir}", str(SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"compiling the C++ unit test failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return out


def test_packed_key_cpp(tmp_path, seed):
    binary = _build(CSRC, tmp_path / "test_packed_key")
    proc = subprocess.run([str(binary), str(seed)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"C++ packed-key test failed (seed {seed}):\n{proc.stdout}{proc.stderr}"
    assert "OK" in proc.stdout


@pytest.mark.parametrize(
    "mutation",
    [
        ("if (u == 0x80000000u) u = 0u;", ""),  # forget -0.0 -> +0.0
        ("return 0xFFFFFFFFu;  // any NaN", "return u;"),  # NaNs not all on top
        ("(0xFFFFFFFFu - static_cast<uint32_t>(global_index))", "(static_cast<uint32_t>(global_index))"),
    ],
    ids=["no_negative_zero_fold", "nan_not_canonical", "index_not_inverted"],
)
def test_cpp_test_catches_broken_encoding(tmp_path, mutation):
    """The C++ test must be able to fail: run it against deliberately broken
    copies of packed_key.h."""
    old, new = mutation
    header = (CSRC / "common" / "packed_key.h").read_text()
    assert old in header, f"mutation anchor {old!r} not found in packed_key.h (update this test)"
    shutil.copytree(CSRC / "common", tmp_path / "common")  # with host_device.h
    (tmp_path / "common" / "packed_key.h").write_text(header.replace(old, new))
    binary = _build(tmp_path, tmp_path / "broken")
    proc = subprocess.run([str(binary), "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, f"the C++ test passed against a broken header ({old!r} -> {new!r})"
