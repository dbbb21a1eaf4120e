"""Shared fixtures. Plain helpers (key model, shard builder, float64 reference
check, the gloo multi-rank launcher) are in tests/helpers.py so that spawned
ranks can import them.

Every test that draws random data takes the ``seed`` (or ``gen``) fixture: a
fresh random seed per test, printed so that a failure report shows it; rerun a
failure with ``LOCALARGMAX_TEST_SEED=<seed>``.
"""
from __future__ import annotations

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def seed(request) -> int:
    env = os.environ.get("LOCALARGMAX_TEST_SEED")
    value = int(env) if env else random.SystemRandom().randrange(2**31)
    print(f"\n[{request.node.nodeid}] random seed {value} (rerun with LOCALARGMAX_TEST_SEED={value})")
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    return value


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(("localargmax seed", f"LOCALARGMAX_TEST_SEED={value}"))


@pytest.fixture(scope="session")
def multirank_run(tmp_path_factory):
    """One launch of 4 gloo ranks running every multi-rank scenario
    (tests/multirank.py). Returns (seed, {name: Scenario}, [results of rank r])."""
    from helpers import run_ranks
    from multirank import WORLD, make_scenarios, worker

    env = os.environ.get("LOCALARGMAX_TEST_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**31)
    scenarios = make_scenarios(seed)
    path = tmp_path_factory.mktemp("multirank") / "scenarios.pt"
    torch.save([tuple(s) for s in scenarios], path)
    per_rank = run_ranks(worker, WORLD, str(path), timeout=300)
    return seed, {s.name: s for s in scenarios}, per_rank
