"""Build localargmax: setup.py drives CMakeLists.txt (CMake + ninja).

Environment switches (all optional):
  LOCALARGMAX_CUDA=0          do not compile the CUDA kernels even if possible
  LOCALARGMAX_CUDA_ARCH=...   CUDA architectures, CMake style
                              (default "80;90a;100": sm_80, sm_90a, sm_100)
  CUDA_HOME                   the CUDA toolkit; default: the real path of nvcc's
                              parent folder, else /usr/local/cuda
  LOCALARGMAX_BUILD_JOBS      parallel compile jobs (default: all cores)

CUDA kernels are compiled whenever torch is a CUDA build and nvcc is found; no
GPU is needed to build them.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


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

        want_cuda = os.environ.get("LOCALARGMAX_CUDA", "1") not in ("0", "off", "OFF", "false")
        cuda_home = find_cuda_home() if (want_cuda and torch.version.cuda) else None
        with_cuda = cuda_home is not None
        args = [
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DTORCH_INCLUDE_DIRS=" + ";".join(cpp_extension.include_paths()),
            f"-DTORCH_LIBRARY_DIR={Path(torch.__file__).parent / 'lib'}",
            f"-DTORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}",
            f"-DLOCALARGMAX_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={find_build_tool('ninja')}",
        ]
        env = dict(os.environ)
        if with_cuda:
            arch = os.environ.get("LOCALARGMAX_CUDA_ARCH", "80;90a;100")
            args += [
                f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc",
                f"-DCUDAToolkit_ROOT={cuda_home}",
                f"-DLOCALARGMAX_CUDA_ARCH={arch}",
            ]
            env["CUDA_HOME"] = cuda_home
        print(f"localargmax: building with CUDA={'yes (' + cuda_home + ')' if with_cuda else 'no'}", flush=True)
        # A cached configure from a different CUDA setting would be reused silently.
        cache = build_dir / "CMakeCache.txt"
        if cache.exists() and f"LOCALARGMAX_WITH_CUDA:BOOL={'ON' if with_cuda else 'OFF'}" not in cache.read_text():
            shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
        cmake = find_build_tool("cmake")
        subprocess.check_call([cmake, "-S", str(ROOT), "-B", str(build_dir), *args], env=env)
        jobs = os.environ.get("LOCALARGMAX_BUILD_JOBS", str(os.cpu_count() or 1))
        log = build_dir / "build.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [cmake, "--build", str(build_dir), "-j", jobs, "--", "-v"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for line in proc.stdout:
                f.write(line)
                if not line.startswith("ptxas info") and "bytes stack frame" not in line:
                    sys.stdout.write(line)
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, "cmake --build")


setup(
    ext_modules=[Extension("localargmax._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
