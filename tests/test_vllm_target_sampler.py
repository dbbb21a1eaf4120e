"""The plugin's target sampler (localargmax/integrations/vllm/target_sampler.py,
``LOCALARGMAX_VLLM_TARGET_SAMPLER=1``) against vLLM 0.34's own Model Runner V2
``Sampler`` (v1/worker/gpu/sample/sampler.py, its Triton kernels interpreted
on the CPU) on gloo TP ranks (2 and 4): the same ``SamplerOutput`` (sampled
ids, ``num_sampled``, ``num_rejected``) on mixed batches of greedy and
random rows at several temperatures and seeds; the coverage rule per
feature; ``GPUModelRunner.sample`` as patched, taking the fused path for a
covered step and vLLM's for a step with a logit-bias request (the counters);
the version rule (0.33 / 0.32 keep vLLM's sampling). The rank bodies are
tests/support/vllm_target_cases.py."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from localargmax.integrations.vllm import versions
from tests.support.vllm_common import NO_TRITON_REASON, vllm_cpu_build


def _vllm_034_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (the target sampler's tests need vLLM 0.34's Model Runner V2 Sampler)"
    if vllm_cpu_build():  # vllm-cpu (0.32 here): no Model Runner V2 sampler of 0.34's shape, no Triton
        return NO_TRITON_REASON
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None  # a source tree on the path: its version is read in the ranks
    if versions.minor(version) != "0.34":
        return f"vLLM {version} is installed; the target sampler serves vLLM 0.34's Model Runner V2 Sampler only"
    return None


MISSING = _vllm_034_missing()
needs_vllm_034 = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def test_versions_033_and_032_keep_vllms_sampling():
    for version in ("0.33.0", "0.32.0"):
        release, note = versions.select(version, "target")
        assert release is None
        assert "no Model Runner V2" in note and version in note


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def res(request):
    if MISSING is not None:
        pytest.skip(MISSING)
    from tests.conftest import draw_seed
    from tests.support import vllm_target_cases
    from tests.support.launch import run_ranks
    from tests.support.vllm_common import rank_env

    seed = draw_seed()
    print(f"\n[test_vllm_target_sampler] tp {request.param}, seed {seed} (rerun with LOCALARGMAX_TEST_SEED={seed})")
    with rank_env():
        ranks = run_ranks(vllm_target_cases.worker, request.param, seed, timeout=600, start_method="spawn")
    for other in ranks[1:]:
        assert other == ranks[0], "the TP ranks returned different results or took different paths"
    return ranks[0]


@needs_vllm_034
def test_installed_with_the_knob(res):
    assert res["target_active"]
    assert res["runner"]["patched"]


@needs_vllm_034
def test_mixed_batches_sample_vllms_tokens(res):
    for step in res["mixed"]:
        assert step["got"] == step["want"], step["temperatures"]
    ids = [row for step in res["mixed"] for row in step["want"]["ids"]]
    assert len({i for (i,) in ids}) > len(ids) // 2  # the rows do sample (not one argmax everywhere)
    assert any(n == 0 for step in res["mixed"] for n in step["want"]["num_sampled"])  # the chunked prefill row


@needs_vllm_034
def test_filtered_batches_sample_vllms_tokens(res):
    """top-k / top-p / min-p rows (with greedy, unfiltered and gather-fallback
    rows) sample vLLM's tokens (issue #57 item 2)."""
    for step in res["filtered"]:
        assert step["got"] == step["want"], step["filters"]
    ids = [row for step in res["filtered"] for row in step["want"]["ids"]]
    assert len({i for (i,) in ids}) > len(ids) // 2  # the rows do sample


@needs_vllm_034
def test_each_uncovered_feature_is_named(res):
    cov = res["coverage"]
    for name in (
        "penalties",
        "logit bias, bad words or a thinking budget",
        "logprobs",
        "min-p with top-p on one request",
    ):
        assert cov[name] == name
    assert cov["top-k with a logit bias"] == "logit bias, bad words or a thinking budget"  # not hidden by the filter
    for name in ("top-k", "top-p", "min-p", "top-k and top-p", "top-k and min-p", "greedy top-k"):
        assert cov[name] is True, (name, cov[name])
    assert cov["draft tokens"] == "draft tokens to verify (rejection sampling)"
    assert cov["grammar"] == "a grammar bitmask (structured output)"


@needs_vllm_034
def test_runner_sample_takes_the_fused_path_when_covered_and_vllms_otherwise(res):
    r = res["runner"]
    assert r["head_found"] is None
    assert r["covered"] == r["covered_want"] == r["covered_vllm"]
    assert r["uncovered"] == r["uncovered_want"]
    reason = "logit bias, bad words or a thinking budget"
    assert r["stats"] == {"target sampler: fused": 1, f"target sampler: vLLM's path: {reason}": 1}
    assert sum(reason in m for m in res["warnings"]) == 1
