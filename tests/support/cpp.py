"""Build and run the C++ unit tests of csrc/common headers (tests/cpp/*.cpp)
with g++, against the real headers or against deliberately broken copies."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def run_cpp_test(name: str, tmp_path: pathlib.Path, seed: int, include_dir: pathlib.Path = CSRC):
    """Compile tests/cpp/<name>.cpp with ``-I include_dir`` and run it with ``seed``."""
    out = tmp_path / name
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include_dir}"]
    cmd += [str(ROOT / "tests" / "cpp" / f"{name}.cpp"), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"compiling the C++ unit test failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return subprocess.run([str(out), str(seed)], capture_output=True, text=True, timeout=120)


def check_cpp_test(name: str, tmp_path: pathlib.Path, seed: int):
    """tests/cpp/<name>.cpp passes against the real headers."""
    proc = run_cpp_test(name, tmp_path, seed)
    assert proc.returncode == 0 and "OK" in proc.stdout, f"seed {seed}:\n{proc.stdout}{proc.stderr}"


def run_against_mutation(name: str, header: str, old: str, new: str, tmp_path: pathlib.Path):
    """Run tests/cpp/<name>.cpp against a copy of csrc/common/<header> with
    ``old`` replaced by ``new``; the test must fail."""
    text = (CSRC / "common" / header).read_text()
    assert old in text, f"mutation anchor {old!r} not found in {header} (update this test)"
    shutil.copytree(CSRC / "common", tmp_path / "common")  # the other headers it includes (host_device.h)
    (tmp_path / "common" / header).write_text(text.replace(old, new))
    proc = run_cpp_test(name, tmp_path, 1, include_dir=tmp_path)
    assert proc.returncode != 0, f"the C++ test passed against a broken {header} ({old!r} -> {new!r})"
