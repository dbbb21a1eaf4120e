"""localargmax/envs.py: the registry of LOCALARGMAX_* variables."""

import pytest
import torch

import localargmax
from localargmax import envs

# A valid value other than the default, for every knob (the test fails when a knob has none here).
OTHER_VALUE = {
    "LOCALARGMAX_DEBUG": ("1", True),
    "LOCALARGMAX_VLLM_PLUGIN": ("0", False),
    "LOCALARGMAX_VLLM_TARGET_SAMPLER": ("1", True),
    "LOCALARGMAX_DISPATCH_TABLE": ("/tmp/measured.json", "/tmp/measured.json"),
    "LOCALARGMAX_CUDA": ("0", False),
    "LOCALARGMAX_CUDA_ARCH": ("90a", "90a"),
    "LOCALARGMAX_BUILD_JOBS": ("3", 3),
    "LOCALARGMAX_BENCH_SMOKE": ("1", True),
    "LOCALARGMAX_TEST_SEED": ("17", 17),
    "LOCALARGMAX_STRESS_CASES": ("5", 5),
    "LOCALARGMAX_TEST_START": ("spawn", "spawn"),
    "LOCALARGMAX_TEST_SKIP_PATHS": ("mma/n16_r64", "mma/n16_r64"),
}


def test_every_knob_is_documented_and_has_a_case():
    assert all(k.startswith("LOCALARGMAX_") and knob.meaning for k, knob in envs.KNOBS.items())
    assert set(OTHER_VALUE) == set(envs.KNOBS)


@pytest.mark.parametrize("name", list(envs.KNOBS))
@pytest.mark.parametrize("blank", ["", " ", "\t", " \n "])
def test_a_blank_value_means_unset(name, blank, monkeypatch):
    """``LOCALARGMAX_VLLM_PLUGIN=" "`` once disabled the plugin and
    ``LOCALARGMAX_CUDA=" "`` gave a CPU-only build: blank is unset."""
    monkeypatch.setenv(name, blank)
    assert envs.read(name) == envs.KNOBS[name].default


@pytest.mark.parametrize("name", list(envs.KNOBS))
def test_a_knob_is_read_when_used(name, monkeypatch):
    """No cache: a variable set after a first read counts from the next one."""
    monkeypatch.delenv(name, raising=False)
    assert getattr(envs, name) == envs.KNOBS[name].default
    raw, parsed = OTHER_VALUE[name]
    monkeypatch.setenv(name, f" {raw} ")
    assert getattr(envs, name) == parsed
    monkeypatch.delenv(name)
    assert getattr(envs, name) == envs.KNOBS[name].default


def test_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "maybe")
    with pytest.raises(ValueError, match="LOCALARGMAX_DEBUG='maybe'"):
        _ = envs.LOCALARGMAX_DEBUG
    monkeypatch.setenv("LOCALARGMAX_BUILD_JOBS", "0")
    with pytest.raises(ValueError, match="LOCALARGMAX_BUILD_JOBS='0'"):
        _ = envs.LOCALARGMAX_BUILD_JOBS
    with pytest.raises(AttributeError):
        _ = envs.LOCALARGMAX_NOT_A_KNOB


def test_debug_set_after_a_first_call_takes_effect(monkeypatch):
    """A notebook (or a spawn child whose module code already ran an op) that
    sets LOCALARGMAX_DEBUG after a first step gets the check from the next
    step on: the check's collective runs (here: a group that counts calls)."""
    calls = []

    def gather(keys):
        calls.append(keys.shape)
        return keys[None]

    monkeypatch.delenv("LOCALARGMAX_DEBUG", raising=False)
    hidden, weight = torch.randn(2, 8), torch.randn(20, 8)
    localargmax.lm_head_argmax(hidden, weight, group=gather)
    seen = []
    monkeypatch.setattr(
        "localargmax.plan.check_step_consistency",
        lambda group, fields, names: seen.append(dict(zip(names, fields))),
    )
    localargmax.lm_head_argmax(hidden, weight, group=gather)
    assert seen == []
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "1")
    localargmax.lm_head_argmax(hidden, weight, group=gather)
    assert len(seen) == 1 and seen[0]["batch size"] == 2


def test_skip_paths_knob_skips_the_tests_that_force_a_path(monkeypatch):
    """LOCALARGMAX_TEST_SKIP_PATHS (set by bench/gpu_check.sh from its configs
    step): tests whose id or parameters name the path, or take its config's
    name, are skipped with the reason; mma/n1_r64 does not match mma/n1_r64_sk2."""
    import types

    from tests import conftest

    def item(nodeid, **params):
        it = types.SimpleNamespace(nodeid=nodeid, callspec=types.SimpleNamespace(params=params), marks=[])
        it.add_marker = it.marks.append
        return it

    items = [
        item("t.py::test_forced[mma/n1_r64-bf16]"),
        item("t.py::test_every_config[bf16-n1_r64]", config="n1_r64"),
        item("t.py::test_pairs[n1_r64-n2_r64]", pair=("n1_r64", "n2_r64", 32)),
        item("t.py::test_forced[mma/n1_r64_sk2-bf16]"),
        item("t.py::test_every_config[bf16-n1_r64_sk2]", config="n1_r64_sk2"),
        item("t.py::test_path[cuda-gemm]", path="gemm"),
    ]
    monkeypatch.setenv("LOCALARGMAX_TEST_SKIP_PATHS", " mma/n1_r64, gemm")
    conftest.pytest_collection_modifyitems(None, items)
    skipped = [bool(it.marks) for it in items]
    assert skipped == [True, True, True, False, False, True]
    assert "mma/n1_r64 failed its first call" in items[0].marks[0].kwargs["reason"]
    monkeypatch.setenv("LOCALARGMAX_TEST_SKIP_PATHS", "")
    fresh = [item("t.py::test_forced[mma/n1_r64-bf16]")]
    conftest.pytest_collection_modifyitems(None, fresh)
    assert fresh[0].marks == []


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2, 1)),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "LOCAL_RANK missing"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "integers"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "< WORLD_SIZE"),
    ],
)
def test_torchrun_rank_reads_all_three_or_none(env, expected, monkeypatch):
    for k in envs.TORCHRUN_VARIABLES:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            envs.torchrun_rank()
    else:
        assert envs.torchrun_rank() == expected
