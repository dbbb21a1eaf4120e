"""Every environment variable the package reads: the ``LOCALARGMAX_*`` knobs
(type, default and meaning, in one table) and torchrun's rank variables
(:func:`torchrun_rank`), each read from the environment when it is used
(never cached; unset, empty or blank means the default).

    from localargmax import envs
    if envs.LOCALARGMAX_DEBUG: ...

Run-time code reads only ``LOCALARGMAX_DEBUG``, ``LOCALARGMAX_DISPATCH_TABLE``
(the measured table ``path="auto"`` follows on CUDA) and the vLLM plugin's
``LOCALARGMAX_VLLM_PLUGIN`` / ``LOCALARGMAX_VLLM_TARGET_SAMPLER``; a forced kernel path is the ops' ``path``
argument, never the environment. The build variables are
read by setup.py (which loads this file by path, before the package exists),
the test and benchmark ones by tests/ and ``localargmax.bench``. A change
of ``os.environ`` in a running process counts from the next use. This module imports nothing from torch or the package.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple


class Knob(NamedTuple):
    parse: Callable[[str], Any]
    default: Any
    used_by: str  # "run time", "build", "benchmark" or "tests"
    meaning: str


def _flag(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no", ""):
        return False
    raise ValueError(f"expected 0/1 (or true/false, on/off), got {value!r}")


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise ValueError(f"expected an integer >= 1, got {value!r}")
    return n


KNOBS: dict[str, Knob] = {
    "LOCALARGMAX_DEBUG": Knob(
        _flag,
        False,
        "run time",
        "Before every key exchange, all-gather each rank's batch size, k, return_log_probs, reduce mode, hidden size, "
        "shard rows and d2t length, and raise ValueError on every rank, naming the input and the ranks, if they differ "
        "(one extra small collective per step).",
    ),
    "LOCALARGMAX_VLLM_PLUGIN": Knob(
        _flag,
        True,
        "run time",
        "Let the vLLM general plugin (localargmax.integrations.vllm) replace LogitsProcessor.get_top_tokens / "
        "get_top_k_tokens when vLLM loads it (0: keep vLLM's own methods).",
    ),
    "LOCALARGMAX_VLLM_TARGET_SAMPLER": Knob(
        _flag,
        False,
        "run time",
        "With the vLLM plugin on vLLM 0.34's Model Runner V2: sample the target model's tokens from the lm_head "
        "shards (GPUModelRunner.sample) for steps of requests with temperature, top-k, top-p, min-p and raw logprobs "
        "only, the tokens vLLM's Sampler draws; other steps keep vLLM's path (0: vLLM's own sampling). Read when the "
        "plugin installs.",
    ),
    "LOCALARGMAX_DISPATCH_TABLE": Knob(
        str,
        None,
        "run time",
        "A measured dispatch table (JSON from python -m bench.tune --write-table PATH, run on the GPU from a "
        "checkout): path='auto' on CUDA follows its cells (localargmax.dispatch). Unset: C++'s own choice. "
        "Read once per path; give every rank the same file.",
    ),
    "LOCALARGMAX_CUDA": Knob(
        _flag,
        True,
        "build",
        "Compile the CUDA kernels when torch is a CUDA build and nvcc is found (0: CPU kernels only, ~2 min builds).",
    ),
    "LOCALARGMAX_CUDA_ARCH": Knob(
        str,
        None,
        "build",
        'CUDA architectures to compile for, CMake style ("90a", "80;90a;100"). Unset (None): those of '
        'TORCH_CUDA_ARCH_LIST (torch\'s syntax, "9.0a", "8.0;8.6+PTX"), else of the visible GPUs (9.0 -> 90a), '
        "else 80;90a;100 (setup.py's choose_cuda_archs).",
    ),
    "LOCALARGMAX_BUILD_JOBS": Knob(
        _positive_int, os.cpu_count() or 1, "build", "Parallel compile jobs (default: all cores)."
    ),
    "LOCALARGMAX_BENCH_SMOKE": Knob(
        _flag, False, "benchmark", "Same as localargmax-bench --smoke: tiny shapes, for tests."
    ),
    "LOCALARGMAX_TEST_SEED": Knob(
        int, 0, "tests", "Seed of the tests' random inputs; 0 draws a fresh one (printed on failure to replay)."
    ),
    "LOCALARGMAX_STRESS_CASES": Knob(
        _positive_int, 10000, "tests", "Random cases of the slow stress test (pytest -m slow)."
    ),
    "LOCALARGMAX_TEST_SKIP_PATHS": Knob(
        str,
        "",
        "tests",
        "Comma-separated kernel paths (simt, gemm, mma/<config name>) whose tests are skipped, naming the reason: "
        "bench/gpu_check.sh sets it to the configs that errored or hung in their first call.",
    ),
    "LOCALARGMAX_TEST_START": Knob(
        str, "forkserver", "tests", "Start method of the multi-rank test launcher: forkserver (fast) or spawn."
    ),
}


def read(name: str) -> Any:
    """The parsed value of ``name`` (a key of :data:`KNOBS`), read from the
    environment now, at every use (as vLLM's ``envs.py`` does): a variable set
    after a first call takes effect at the next one. Unset, empty or blank
    (only whitespace) means the default. Raises ValueError naming the
    variable for a value that does not parse, KeyError for an unknown name."""
    knob = KNOBS[name]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return knob.default
    try:
        return knob.parse(raw.strip())
    except ValueError as e:
        raise ValueError(f"{name}={raw!r}: {e}") from None


class TorchrunRank(NamedTuple):
    rank: int
    world_size: int
    local_rank: int


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def torchrun_rank() -> TorchrunRank | None:
    """This process's rank as torchrun (or a launcher like it) set it in
    ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``, read now; None when none of
    them is set. Raises ValueError when only some are set or one is not a
    non-negative integer (rank < world size)."""
    raw = {k: os.environ.get(k) for k in TORCHRUN_VARIABLES}
    if all(v is None for v in raw.values()):
        return None
    missing = [k for k, v in raw.items() if v is None]
    if missing:
        raise ValueError(f"torchrun's variables are partly set: {', '.join(missing)} missing ({raw})")
    try:
        got = TorchrunRank(*(int(raw[k]) for k in TORCHRUN_VARIABLES))
    except ValueError:
        raise ValueError(f"torchrun's variables must be integers, got {raw}") from None
    if not (0 <= got.rank < got.world_size and 0 <= got.local_rank < got.world_size):
        raise ValueError(f"torchrun's variables must give 0 <= RANK, LOCAL_RANK < WORLD_SIZE, got {raw}")
    return got


def __getattr__(name: str) -> Any:
    if name in KNOBS:
        return read(name)
    raise AttributeError(f"module 'localargmax.envs' has no attribute {name!r}")
