"""Build localargmax: setup.py drives CMakeLists.txt (CMake + ninja).

Environment switches (all optional; the registry is localargmax/envs.py):
  LOCALARGMAX_CUDA=0          do not compile the CUDA kernels even if possible
  LOCALARGMAX_CUDA_ARCH=...   CUDA architectures, CMake style ("90a",
                              "80;90a;100"); unset: see below
  TORCH_CUDA_ARCH_LIST=...    PyTorch's syntax ("9.0a", "8.0;9.0a", "8.6+PTX"),
                              used when LOCALARGMAX_CUDA_ARCH is unset
  CUDA_HOME                   the CUDA toolkit; default: the real path of nvcc's
                              parent folder, else /usr/local/cuda
  LOCALARGMAX_BUILD_JOBS      parallel compile jobs (default: all cores)

CUDA kernels are compiled whenever torch is a CUDA build and nvcc is found; no
GPU is needed to build them. Their architectures (choose_cuda_archs): those of
LOCALARGMAX_CUDA_ARCH, else of TORCH_CUDA_ARCH_LIST, else of the visible GPUs,
else "80;90a;100" (sm_80, sm_90a, sm_100); the build prints which and why.

The build prints what it compiles, an estimate of how long that takes, ninja's
[n/N] progress and the time it took. pip shows a build's output only with
``pip install -v``; the full log is build/cmake-*/build.log either way.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Seconds to compile one file on one core of a 2-core machine (measured from
# ninja's log, build/cmake-*/.ninja_log, with both cores busy): a C++ file, and
# a .cu file for each CUDA architecture. ninja runs `jobs` files at once.
SECONDS_PER_CPP_FILE = 10
SECONDS_PER_CUDA_FILE_AND_ARCH = 30


def load_envs():
    """localargmax/envs.py, the registry of LOCALARGMAX_* variables, loaded by
    path (the package cannot be imported before it is built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("localargmax_envs", ROOT / "localargmax" / "envs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The CUDA architectures when neither variable names any and no GPU is visible.
DEFAULT_CUDA_ARCHS = "80;90a;100"
# TORCH_CUDA_ARCH_LIST's names, expanded as torch.utils.cpp_extension's
# _get_cuda_arch_flags does (torch 2.14.1).
TORCH_NAMED_ARCHS = {
    "Kepler+Tesla": "3.7",
    "Kepler": "3.5+PTX",
    "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX",
    "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX",
    "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX",
    "Ada": "8.9+PTX",
    "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX",
    "Rubin": "10.7+PTX",
}
_TORCH_ARCH = re.compile(r"(\d+)\.(\d)(a?)(\+PTX)?")
_TORCH_SYNTAX = (
    "entries like 8.0, 9.0a, 10.0 or 8.6+PTX (major.minor, an optional 'a', an optional '+PTX'), "
    "separated by ';' or spaces; or a name torch knows (Ampere, Hopper, ...); or 'native'"
)


def cmake_arch_of_capability(major: int, minor: int) -> str:
    """The CMake architecture built for a GPU of compute capability
    major.minor: "90a" for 9.0 (what the default builds, the sm_90a code the
    tests inspect), else "<major><minor>" ("80", "100", "120"). Plain, not
    "-real": machine code plus PTX, as in the default list."""
    return "90a" if (major, minor) == (9, 0) else f"{major}{minor}"


def torch_arch_list_to_cmake(value: str) -> str:
    """PyTorch's TORCH_CUDA_ARCH_LIST (not "native") as CMake's
    CUDA_ARCHITECTURES, with torch's meaning (torch.utils.cpp_extension's
    _get_cuda_arch_flags): "X.Y" is machine code only
    (code=sm_XY: CMake "XY-real"), "X.Y+PTX" machine code and PTX
    (code=sm_XY plus code=compute_XY: CMake "XY"), "X.Ya" the arch-specific
    "XYa" ("9.0a" -> "90a-real", "9.0a+PTX" -> "90a"). An architecture listed
    both ways gets both; order of first appearance, no repeats. Raises
    ValueError naming the variable and the syntax for anything else."""
    entries = []
    for entry in re.split(r"[;\s]+", value.strip()):
        entries += TORCH_NAMED_ARCHS.get(entry, entry).split(";") if entry else []
    if not entries:
        raise ValueError(f"TORCH_CUDA_ARCH_LIST={value!r} names no architecture; expected {_TORCH_SYNTAX}")
    ptx: dict[str, bool] = {}  # architecture -> whether PTX too, in order of first appearance
    for entry in entries:
        m = _TORCH_ARCH.fullmatch(entry)
        if m is None:
            raise ValueError(
                f"TORCH_CUDA_ARCH_LIST={value!r}: {entry!r} is not an architecture; expected {_TORCH_SYNTAX}"
            )
        arch = f"{m[1]}{m[2]}{m[3]}"
        ptx[arch] = ptx.get(arch, False) or bool(m[4])
    return ";".join(arch if with_ptx else f"{arch}-real" for arch, with_ptx in ptx.items())


def choose_cuda_archs(
    env: Mapping[str, str],
    visible: Sequence[tuple[int, int]] | Callable[[], Sequence[tuple[int, int]]],
) -> tuple[str, str]:
    """The CUDA architectures to build (CMake's CUDA_ARCHITECTURES) and why,
    in a few words: from ``LOCALARGMAX_CUDA_ARCH`` (CMake style, as given),
    else from ``TORCH_CUDA_ARCH_LIST`` (torch_arch_list_to_cmake; "native":
    the visible GPUs, as torch reads it), else from the visible GPUs' compute
    capabilities (cmake_arch_of_capability), else DEFAULT_CUDA_ARCHS. An
    unset, empty or blank variable is unset (as in localargmax/envs.py).
    ``visible``: the (major, minor) of each visible GPU, or a function giving
    them, called only when they decide."""

    def gpus() -> list[tuple[int, int]]:
        return sorted({(int(a), int(b)) for a, b in (visible() if callable(visible) else visible)})

    def from_gpus(caps: list[tuple[int, int]]) -> str:
        return ";".join(dict.fromkeys(cmake_arch_of_capability(*c) for c in caps))

    def named(caps: list[tuple[int, int]]) -> str:
        return "compute capability " + ", ".join(f"{a}.{b}" for a, b in caps)

    own = (env.get("LOCALARGMAX_CUDA_ARCH") or "").strip()
    if own:
        return own, f"from LOCALARGMAX_CUDA_ARCH={own!r}"
    torch_list = (env.get("TORCH_CUDA_ARCH_LIST") or "").strip()
    if torch_list == "native":
        caps = gpus()
        if not caps:
            raise ValueError(
                "TORCH_CUDA_ARCH_LIST='native' but no GPU is visible; name the architectures "
                f"(LOCALARGMAX_CUDA_ARCH, CMake style, or TORCH_CUDA_ARCH_LIST: {_TORCH_SYNTAX})"
            )
        return from_gpus(caps), f"from TORCH_CUDA_ARCH_LIST='native': the visible GPUs, {named(caps)}"
    if torch_list:
        return torch_arch_list_to_cmake(torch_list), f"from TORCH_CUDA_ARCH_LIST={torch_list!r}"
    caps = gpus()
    if caps:
        return from_gpus(caps), f"from the visible GPUs, {named(caps)}"
    return DEFAULT_CUDA_ARCHS, "the default: no LOCALARGMAX_CUDA_ARCH, no TORCH_CUDA_ARCH_LIST, no GPU visible"


def visible_gpus() -> list[tuple[int, int]]:
    """(major, minor) compute capability of each GPU torch sees, [] without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]


def find_cuda_home():
    """The CUDA toolkit root, or None. Avoids the CUDA_HOME=/usr/local trap:
    /usr/local/bin/nvcc is a link into /usr/local/cuda, so resolve it."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [env] if env else []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates.append("/usr/local/cuda")
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc").exists() and (Path(c) / "include" / "cuda_runtime.h").exists():
            return str(Path(c).resolve())
    return None


def find_build_tool(name: str) -> str:
    """The copy of a build tool (cmake, ninja) installed next to this Python
    (``pip install cmake ninja`` into the venv), else the one on PATH. The
    venv's copy first: a venv whose bin/ is not on PATH (a script calling
    .venv/bin/python directly) would otherwise pick up an older system cmake
    (CMakeLists.txt needs >= 3.26)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"localargmax: {name} not found next to {sys.executable} or on PATH; pip install {name}")
    return found


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch
        from torch.utils import cpp_extension

        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = ROOT / "build" / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}"
        build_dir.mkdir(parents=True, exist_ok=True)

        envs = load_envs()
        want_cuda = envs.LOCALARGMAX_CUDA
        cuda_home = find_cuda_home() if (want_cuda and torch.version.cuda) else None
        with_cuda = cuda_home is not None
        args = [
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DTORCH_INCLUDE_DIRS=" + ";".join(cpp_extension.include_paths()),
            f"-DTORCH_LIBRARY_DIR={Path(torch.__file__).parent / 'lib'}",
            f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}",
            f"-DLOCALARGMAX_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DLOCALARGMAX_TORCH_VERSION={torch.__version__}",  # checked at import (localargmax/__init__.py)
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={find_build_tool('ninja')}",
        ]
        env = dict(os.environ)
        if with_cuda:
            arch, why = choose_cuda_archs(os.environ, visible_gpus)
            args += [
                f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc",
                f"-DCUDAToolkit_ROOT={cuda_home}",
                f"-DLOCALARGMAX_CUDA_ARCH={arch}",
            ]
            env["CUDA_HOME"] = cuda_home
        print(f"localargmax: building with CUDA={'yes (' + cuda_home + ')' if with_cuda else 'no'}", flush=True)
        if with_cuda:
            print(f"localargmax: CUDA architectures {arch} ({why})", flush=True)
        # A cached configure from a different CUDA setting would be reused silently.
        cache = build_dir / "CMakeCache.txt"
        if cache.exists() and f"LOCALARGMAX_WITH_CUDA:BOOL={'ON' if with_cuda else 'OFF'}" not in cache.read_text():
            shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
        cmake = find_build_tool("cmake")
        subprocess.check_call([cmake, "-S", str(ROOT), "-B", str(build_dir), *args], env=env)
        archs = arch.split(";") if with_cuda else []
        sources = pending_sources(cmake, build_dir, env)
        jobs = str(envs.LOCALARGMAX_BUILD_JOBS)
        print(plan(sources, archs, int(jobs)), flush=True)
        log = build_dir / "build.log"
        seconds = compile_with_progress([cmake, "--build", str(build_dir), "-j", jobs], env, log, sources)
        print(f"localargmax: built in {_clock(seconds)} (min:s); full log {log}", flush=True)


def compile_with_progress(command: list, env: dict, log: Path, sources: list) -> float:
    """Run the build, copying its output to ``log`` and to stdout (ninja's
    [n/N] lines, which it prints as each file finishes, prefixed with the
    elapsed time; not ptxas' per-kernel resource lines), and every minute the
    files not finished yet. Returns the seconds it took."""
    start = time.monotonic()
    finished = []
    quiet = threading.Event()

    def heartbeat():
        while not quiet.wait(60):
            left = [Path(s).name.removesuffix(".o") for s in sources if not any(s in line for line in finished)]
            if left:
                print(f"localargmax {_clock(time.monotonic() - start)} not finished yet: {', '.join(left)}", flush=True)

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        with open(log, "w") as f:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                f.write(line)
                if line.startswith("["):
                    finished.append(line)
                if not line.startswith("ptxas info") and "bytes stack frame" not in line:
                    print(f"localargmax {_clock(time.monotonic() - start)} {line}", end="", flush=True)
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, "cmake --build")
    finally:
        quiet.set()
    return time.monotonic() - start


def pending_sources(cmake: str, build_dir: Path, env: dict) -> list:
    """The source files the next build will compile (a ninja dry run)."""
    out = subprocess.run(
        [cmake, "--build", str(build_dir), "--", "-n"], env=env, capture_output=True, text=True, check=True
    ).stdout
    return [line.split(" object ", 1)[1].strip() for line in out.splitlines() if " object " in line]


def plan(sources: list, archs: list, jobs: int) -> str:
    """What the build compiles and roughly how long that takes (the files'
    compile times shared over `jobs` parallel compiles), in one paragraph."""
    cu = [s for s in sources if s.endswith(".cu.o")]
    cpp = len(sources) - len(cu)
    work = cpp * SECONDS_PER_CPP_FILE + len(cu) * len(archs) * SECONDS_PER_CUDA_FILE_AND_ARCH
    seconds = work / max(1, min(jobs, len(sources)))
    what = f"{cpp} C++ file(s)"
    if archs:
        what += f" + {len(cu)} CUDA file(s) for {len(archs)} architecture(s) ({', '.join(archs)})"
    lines = [
        f"localargmax: compiling {what}, {jobs} at a time; about {_clock(seconds)} (min:s) on a 2-core "
        "machine's cores, more when they are busy."
    ]
    if archs:
        lines.append(
            "localargmax: no GPU here? LOCALARGMAX_CUDA=0 skips the CUDA kernels; "
            "LOCALARGMAX_CUDA_ARCH=90a builds one architecture."
        )
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


# pip (setuptools.build_meta) and `python setup.py` run this file as __main__;
# tests/test_build_arch.py loads it for choose_cuda_archs without building.
if __name__ == "__main__":
    setup(
        ext_modules=[Extension("localargmax._C", sources=[])],
        cmdclass={"build_ext": CMakeBuild},
    )
