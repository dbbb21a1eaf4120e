"""Fixtures: random seeds and kernel paths.

Every test that draws random data takes the ``seed`` (or ``gen``) fixture: a
fresh random seed per test, printed so that a failure report shows it; rerun a
failure with ``LOCALARGMAX_TEST_SEED=<seed>``. ``path`` runs a test once per
kernel path (CPU ISA variants; CUDA paths where a GPU is present), ``cuda_path``
once per CUDA path; paths this machine lacks are skipped, saying why.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import sys
import tempfile

# The suite writes only to temporary folders (and never installs anything: see
# pytest_sessionfinish): no bytecode beside the sources, and torch.compile's
# inductor / triton caches in a folder of this run's, removed at exit. Set
# before torch is imported; spawned ranks and subprocesses inherit them (and the
# folder: a spawned process that imports this file reuses its parent's, which the
# parent removes; a process of its own would leave one behind, as spawned ranks
# end without running atexit).
sys.dont_write_bytecode = True
_CACHE = os.environ.get("LOCALARGMAX_TEST_CACHE", "")
if not os.path.isdir(_CACHE):
    _CACHE = os.environ["LOCALARGMAX_TEST_CACHE"] = tempfile.mkdtemp(prefix="localargmax-test-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
for _var, _sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
    os.environ[_var] = os.path.join(_CACHE, _sub)
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

from tests.support.paths import ALL_PATHS, CUDA_PATHS, poison_cuda_allocator, unavailable, use_path  # noqa: E402

# No .hypothesis/ folder in the checkout: no example database, and hypothesis'
# other caches (its constants) in this run's folder.
settings.register_profile("localargmax", database=None)
settings.load_profile("localargmax")
set_hypothesis_home_dir(os.path.join(_CACHE, "hypothesis"))


_SITE_PATH = list(sys.path)  # as the run starts: an import that extends sys.path (setuptools' vendored
# packages, say) must not read as an install


def _installed() -> list[str]:
    """``name==version`` of every distribution installed where this run started looking."""
    from importlib import metadata

    return sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions(path=_SITE_PATH))


_INSTALLED_AT_START = _installed()


def pytest_sessionfinish(session, exitstatus):
    """The suite never installs, uninstalls or upgrades a package: fail the run if it did."""
    after = _installed()
    if after != _INSTALLED_AT_START:
        gone = sorted(set(_INSTALLED_AT_START) - set(after))
        new = sorted(set(after) - set(_INSTALLED_AT_START))
        session.config.get_terminal_writer().line(
            f"localargmax: the test run changed the installed packages (removed {gone}, added {new}): "
            "a test installs or uninstalls something",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def draw_seed() -> int:
    from localargmax import envs

    env = envs.LOCALARGMAX_TEST_SEED  # read per test (not cached); 0: a fresh seed
    return env if env else random.SystemRandom().randrange(2**31)


@pytest.fixture
def seed(request) -> int:
    value = draw_seed()
    print(f"\n[{request.node.nodeid}] random seed {value} (rerun with LOCALARGMAX_TEST_SEED={value})")
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    return value


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pytest_collection_modifyitems(config, items):
    """LOCALARGMAX_TEST_SKIP_PATHS (bench/gpu_check.sh: the configs that
    errored or hung in their first call): skip the tests that force one of
    those paths, naming it, so one bad config does not eat the run."""
    import re

    from localargmax import envs

    paths = [p.strip() for p in envs.LOCALARGMAX_TEST_SKIP_PATHS.split(",") if p.strip()]
    if not paths:
        return
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for p in paths:
            token = re.compile(rf"(?<![\w/]){re.escape(p)}(?![\w/])")
            hit = token.search(item.nodeid) or any(token.fullmatch(str(v)) for v in params.values())
            if p.startswith("mma/"):  # tests that take the config's name itself
                config = p[4:]
                hit = hit or any(
                    ("config" in name and v == config) or (name == "pair" and config in tuple(v))
                    for name, v in params.items()
                )
            if hit:
                item.add_marker(pytest.mark.skip(reason=f"{p} failed its first call (LOCALARGMAX_TEST_SKIP_PATHS)"))
                break


def pytest_make_parametrize_id(config, val, argname):
    """Parametrised ids name dtypes (``float16``, not ``dtype1``)."""
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(("localargmax seed", f"LOCALARGMAX_TEST_SEED={value}"))


def _path_fixture(request):
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    with use_path(request.param) as path:
        if path.device == "cuda":
            poison_cuda_allocator()
        yield path


def _params(paths):
    return [pytest.param(p, id=str(p), marks=[pytest.mark.gpu] if p.device == "cuda" else []) for p in paths]


path = pytest.fixture(params=_params(ALL_PATHS))(_path_fixture)
cuda_path = pytest.fixture(params=_params(CUDA_PATHS))(_path_fixture)


@pytest.fixture(scope="module")
def emu():
    """The host emulation of the CUDA kernels (tests/support/emulation.py), one
    per test module; its library is built once per content and cached."""
    from tests.support.emulation import Emulator, build

    return Emulator(build())


@pytest.fixture(scope="session")
def multirank_run(tmp_path_factory):
    """One launch of 4 gloo ranks running every multi-rank scenario
    (tests/support/scenarios.py). Returns (seed, {name: Scenario}, [results of rank r])."""
    from tests.support.launch import run_ranks
    from tests.support.scenarios import WORLD, make_scenarios, worker

    seed = draw_seed()
    scenarios = make_scenarios(seed)
    path = tmp_path_factory.mktemp("multirank") / "scenarios.pt"
    torch.save([tuple(s) for s in scenarios], path)
    return seed, {s.name: s for s in scenarios}, run_ranks(worker, WORLD, str(path), timeout=300)
