"""The CUDA architectures a build compiles for (setup.py's choose_cuda_archs):
LOCALARGMAX_CUDA_ARCH (CMake style), else TORCH_CUDA_ARCH_LIST (PyTorch's
syntax, with torch's meaning), else the visible GPUs, else "80;90a;100". The
pure function is tested without building (setup.py runs setup() only as
__main__, which is how pip runs it); one slow test builds a copy of the
checkout with TORCH_CUDA_ARCH_LIST=9.0a and reads the library's machine code."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_setup():
    """setup.py as a module (setup() runs only as __main__), against a stand-in
    for setuptools: importing the real one puts its vendored packages on
    sys.path, which the suite's no-install check (conftest.py) would read as
    installed. The functions tested here use none of it."""
    setuptools = types.ModuleType("setuptools")
    setuptools.Extension = setuptools.setup = None
    command = types.ModuleType("setuptools.command")
    build_ext = types.ModuleType("setuptools.command.build_ext")
    build_ext.build_ext = object
    stand_in = {"setuptools": setuptools, "setuptools.command": command, "setuptools.command.build_ext": build_ext}
    spec = importlib.util.spec_from_file_location("localargmax_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, stand_in):
        spec.loader.exec_module(module)
    return module


S = _load_setup()
DEFAULT = "80;90a;100"


def no_gpus_asked():
    raise AssertionError("the visible GPUs were queried although a variable decides")


def choose(env, visible=no_gpus_asked):
    return S.choose_cuda_archs(env, visible)


# --- precedence --------------------------------------------------------------------------


def test_localargmax_cuda_arch_comes_first():
    env = {"LOCALARGMAX_CUDA_ARCH": "90a", "TORCH_CUDA_ARCH_LIST": "8.0"}
    assert choose(env) == ("90a", "from LOCALARGMAX_CUDA_ARCH='90a'")


def test_localargmax_cuda_arch_is_passed_as_given_cmake_style():
    assert choose({"LOCALARGMAX_CUDA_ARCH": " 80-real;90a;100 "})[0] == "80-real;90a;100"


def test_torch_cuda_arch_list_comes_before_the_visible_gpus():
    assert choose({"TORCH_CUDA_ARCH_LIST": "9.0a"}) == ("90a-real", "from TORCH_CUDA_ARCH_LIST='9.0a'")


def test_the_visible_gpus_come_before_the_default():
    arch, why = choose({}, [(9, 0)])
    assert arch == "90a" and why == "from the visible GPUs, compute capability 9.0"


def test_the_default_without_variables_or_gpus():
    arch, why = choose({}, [])
    assert arch == DEFAULT and "default" in why and "no GPU visible" in why
    assert choose({}, list)[0] == DEFAULT  # a function giving no GPUs


@pytest.mark.parametrize("blank", ["", " ", "\t", " \n "])
def test_a_blank_value_means_unset(blank):
    assert choose({"LOCALARGMAX_CUDA_ARCH": blank, "TORCH_CUDA_ARCH_LIST": "8.0"})[0] == "80-real"
    assert choose({"LOCALARGMAX_CUDA_ARCH": blank, "TORCH_CUDA_ARCH_LIST": blank}, [(10, 0)])[0] == "100"
    assert choose({"LOCALARGMAX_CUDA_ARCH": blank, "TORCH_CUDA_ARCH_LIST": blank}, [])[0] == DEFAULT


def test_the_knob_defaults_to_unset():
    """localargmax/envs.py (loaded by path, as setup.py does): unset is None."""
    knob = S.load_envs().KNOBS["LOCALARGMAX_CUDA_ARCH"]
    assert knob.default is None and "TORCH_CUDA_ARCH_LIST" in knob.meaning


# --- TORCH_CUDA_ARCH_LIST's syntax: "X.Y" machine code only (CMake XY-real), +PTX also PTX (CMake XY) ---


@pytest.mark.parametrize(
    "value,cmake",
    [
        ("9.0a", "90a-real"),
        ("8.0", "80-real"),
        ("10.0", "100-real"),
        ("12.0", "120-real"),
        ("9.0", "90-real"),  # torch's 9.0 is sm_90, not the arch-specific sm_90a
        ("8.6+PTX", "86"),
        ("9.0a+PTX", "90a"),
        ("8.0;9.0a", "80-real;90a-real"),
        ("8.0 9.0a 10.0+PTX", "80-real;90a-real;100"),
        (" 8.0 ; 9.0a\t", "80-real;90a-real"),
        ("10.0;8.0", "100-real;80-real"),  # the order given
        ("8.0;8.0+PTX;8.0", "80"),  # both ways: both, once
        ("Hopper", "90"),  # torch's names: Hopper is 9.0+PTX
        ("Ampere;9.0a", "80-real;86;90a-real"),
    ],
)
def test_torch_cuda_arch_list_forms(value, cmake):
    assert choose({"TORCH_CUDA_ARCH_LIST": value}) == (cmake, f"from TORCH_CUDA_ARCH_LIST={value.strip()!r}")


@pytest.mark.parametrize("value", ["90a", "sm_90a", "9", "9.0b", "9.0+ptx", "9.0a,10.0", "Hopper+PTX", "Grace", ";"])
def test_a_malformed_torch_cuda_arch_list_names_the_variable_and_the_syntax(value):
    with pytest.raises(
        ValueError, match=r"TORCH_CUDA_ARCH_LIST=.*expected entries like 8\.0, 9\.0a, 10\.0 or 8\.6\+PTX"
    ):
        choose({"TORCH_CUDA_ARCH_LIST": value}, [(9, 0)])


def test_native_means_the_visible_gpus():
    arch, why = choose({"TORCH_CUDA_ARCH_LIST": "native"}, [(9, 0), (8, 0)])
    assert arch == "80;90a" and "native" in why and "8.0, 9.0" in why
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST='native' but no GPU is visible"):
        choose({"TORCH_CUDA_ARCH_LIST": "native"}, [])


# --- the visible GPUs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "visible,cmake",
    [
        ([(8, 0)], "80"),
        ([(9, 0)], "90a"),  # the sm_90a code the default builds (and tests/test_build.py inspects)
        ([(10, 0)], "100"),
        ([(9, 0)] * 8, "90a"),  # one per architecture
        ([(10, 0), (8, 0), (9, 0)], "80;90a;100"),
        ([(8, 6)], "86"),
    ],
)
def test_visible_gpus(visible, cmake):
    assert choose({}, visible)[0] == cmake
    assert choose({}, lambda: visible)[0] == cmake  # or a function giving them


# --- setup.py as pip runs it ---------------------------------------------------------------


def test_pip_runs_setup_as_main():
    """setuptools.build_meta (pip's path) executes setup.py with __name__ ==
    "__main__", so the guard that lets these tests load setup.py keeps pip's
    build: setup() is called once, with the CMake build_ext (in a fresh
    interpreter, setuptools' setup() replaced by a recorder)."""
    code = (
        "import setuptools, setuptools.build_meta as b\n"
        "calls = []\n"
        "setuptools.setup = lambda **kw: calls.append(kw)\n"
        "b._BuildMetaBackend().run_setup('setup.py')\n"
        "print(len(calls), calls[0]['cmdclass']['build_ext'].__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["1", "CMakeBuild"], proc.stdout + proc.stderr


# --- slow: a real build for TORCH_CUDA_ARCH_LIST=9.0a --------------------------------------


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, PATH, or the Triton wheel torch brings."""
    candidates = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    cuda_home = S.find_cuda_home()
    if cuda_home:
        candidates.append(str(Path(cuda_home) / "bin" / "cuobjdump"))
    try:
        import triton

        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in candidates if c and Path(c).exists()), None)


@pytest.mark.slow
def test_build_for_torch_cuda_arch_list_carries_only_sm90a(tmp_path, monkeypatch):
    """pip builds a copy of the checkout (its sources, in a temporary folder)
    with TORCH_CUDA_ARCH_LIST=9.0a and LOCALARGMAX_CUDA_ARCH unset: the build
    says why, and the library's only machine code is sm_90a (no PTX: torch's
    "9.0a" is code=sm_90a only)."""
    import torch

    if not torch.version.cuda:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA kernels are compiled")
    if S.find_cuda_home() is None:
        pytest.skip("nvcc not found (CUDA_HOME, PATH, /usr/local/cuda): no CUDA kernels are compiled")
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit bin/, PATH, or triton's bundled copy) to read the library")

    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "CMakeLists.txt", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("_C*.so", "__pycache__", "*.pyc")
    for name in ("csrc", "localargmax"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    monkeypatch.delenv("LOCALARGMAX_CUDA_ARCH", raising=False)
    monkeypatch.delenv("LOCALARGMAX_CUDA", raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    wheels = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-index"]
    proc = subprocess.run(
        [*cmd, "--no-cache-dir", "-w", str(wheels), str(src)], capture_output=True, text=True, timeout=3600
    )
    output = proc.stdout + proc.stderr  # pip -v passes the build's output on stderr
    ours = "".join(line for line in output.splitlines(keepends=True) if "localargmax" in line)
    assert proc.returncode == 0, ours[-6000:] + proc.stderr[-3000:]
    assert "localargmax: CUDA architectures 90a-real (from TORCH_CUDA_ARCH_LIST='9.0a')" in output, ours[-6000:]

    (wheel,) = wheels.glob("localargmax-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (so,) = [n for n in z.namelist() if re.fullmatch(r"localargmax/_C.*\.so", n)]
        library = Path(z.extract(so, tmp_path / "unpacked"))
    elf = subprocess.run([tool, "--list-elf", str(library)], capture_output=True, text=True, check=True).stdout
    assert set(re.findall(r"\.(sm_\w+)\.cubin", elf)) == {"sm_90a"}, elf
    ptx = subprocess.run([tool, "--list-ptx", str(library)], capture_output=True, text=True).stdout
    assert not re.search(r"\.ptx\b", ptx), ptx
