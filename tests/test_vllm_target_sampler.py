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
        # rows with an exact tie at the filters' boundary may differ (docs/vllm.md); the rest are vLLM's ids
        same = {k: v for k, v in step["got"].items() if k != "ids"} == {
            k: v for k, v in step["want"].items() if k != "ids"
        }
        assert same, step["filters"]
        for b, tie in enumerate(step["tie_at_boundary"]):
            if not tie:
                assert step["got"]["ids"][b] == step["want"]["ids"][b], (b, step["filters"][b])
    assert sum(not t for step in res["filtered"] for t in step["tie_at_boundary"]) >= 0.9 * sum(
        len(step["tie_at_boundary"]) for step in res["filtered"]
    )
    ids = [row for step in res["filtered"] for row in step["want"]["ids"]]
    assert len({i for (i,) in ids}) > len(ids) // 2  # the rows do sample


F32_ULP_BOUND = 2.0**-22
"""|log-probability error| allowed per unit of magnitude: the float64 value rounded once to float32
(half an ulp, 2**-24 relative) plus the float64 log-partition's own error, far below it."""


@needs_vllm_034
@pytest.mark.parametrize("case", ["raw_logprobs", "raw_logits", "raw_logprobs, filters"])
def test_logprobs_are_vllms(res, case):
    """Issue #57 item 2: rows asking 0-20 logprobs (and rows asking none) get
    vLLM's LogprobsTensors: the same ids (the sampled id, then the top ids)
    and ranks exactly, the values vLLM's within float32 rounding of the
    float64 reference (raw_logits: the logits, bit for bit)."""
    for step in res["logprobs"][case]:
        want, got = step["want"], step["got"]
        assert got["ids"] == want["ids"]
        assert got["ranks"] == want["ranks"]
        assert got["logprob_dtypes"] == want["logprob_dtypes"] == ["torch.int64", "torch.float32", "torch.int64"]
        assert got["cu"] == want["cu"]
        assert len(got["logprob_ids"]) == len(want["logprob_ids"])
        for b, (gi, wi) in enumerate(zip(got["logprob_ids"], want["logprob_ids"])):
            assert len(gi) == len(wi) == 21
            assert gi[0] == wi[0] == want["ids"][b][0]
            if step["decided"][b]:
                assert sorted(gi[1:]) == sorted(wi[1:]), b
            for j, (i, gv, wv) in enumerate(zip(gi, got["logprob_values"][b], want["logprob_values"][b])):
                ref = step["ref"][b][i]
                if case == "raw_logits":
                    assert gv == wv, (b, j)
                    continue
                assert abs(gv - ref) <= F32_ULP_BOUND * max(1.0, abs(ref)), (b, j, gv, ref)
                assert abs(wv - ref) <= 4 * F32_ULP_BOUND * max(1.0, abs(ref)) + 1e-6, (b, j, wv, ref)  # vLLM's float32
        routes = {k: v for k, v in step["routes"].items() if k.startswith("target")}
        assert routes == {"target sampler: shard logits": 1}
    ranks = [r for step in res["logprobs"][case] for r in step["want"]["ranks"]]
    assert len(set(ranks)) > 3  # the sampled ids' ranks vary (not all the argmax)


@needs_vllm_034
@pytest.mark.parametrize("case", ["bf16", "fp16", "fp64 noise", "bf16, filters"])
def test_shard_logits_route_samples_vllms_tokens(res, case):
    """A bf16 / fp16 head (vLLM samples its logits rounded to the model
    dtype: the top two tie often), vLLM's use_fp64_gumbel, and a bf16 head
    with top-k / min-p (gather-fallback rows among them; top-p on bf16: see
    vllm_target_cases.NO_TOP_P): the
    shard-logits route gives vLLM's tokens on every row but those with an
    exact tie at the filters' boundary (top-k: vLLM keeps every tied id,
    ours k; top-p: the tied ids vLLM keeps follow its sort's order, ours the
    smaller ids: DESIGN.md, "Filtered sampling")."""
    compared = 0
    for step in res["exact"][case]:
        assert step["routes"] == {"target sampler: shard logits": 1}
        assert {k: v for k, v in step["got"].items() if k != "ids"} == {
            k: v for k, v in step["want"].items() if k != "ids"
        }
        for b, tie in enumerate(step["tie_at_k"]):
            if not tie:
                compared += 1
                assert step["got"]["ids"][b] == step["want"]["ids"][b], (b, step["want"]["ids"][b])
    assert compared >= 0.5 * sum(len(step["tie_at_k"]) for step in res["exact"][case])  # bf16: a third tie
    if case == "bf16":
        assert sum(step["top_ties"] for step in res["exact"][case]) > 0  # the ties the route must break as vLLM


@needs_vllm_034
@pytest.mark.parametrize("where", ["one rank", "every rank", "one rank, no filters", "every rank, no filters"])
def test_nan_logits_follow_vllms_sampler(res, where):
    """Issue #67 item 2: vLLM's Sampler drops NaN logits and draws among the
    finite ones (greedy rows too); the target sampler on the shards gives its
    tokens on rows with NaN on one rank or on every rank, with top-k / min-p
    rows (the shard-logits route) and without (the fused kernel under vLLM's
    noise), never a NaN id."""
    route = "target sampler: fused" if "no filters" in where else "target sampler: shard logits"
    for step in res["nan"][where]:
        assert step["routes"] == {route: 1}
        assert step["got"] == step["want"]
        nan_ids = set(step["nan_ids"])  # ids 3 and 40; on every rank also two ids of the last ranks' shards
        assert {3, 40} <= nan_ids and len(nan_ids) == (4 if where.startswith("every rank") else 2)
        assert not nan_ids & {i for (i,) in step["want"]["ids"]}


@needs_vllm_034
def test_each_uncovered_feature_is_named(res):
    cov = res["coverage"]
    for name in (
        "penalties",
        "logit bias, bad words or a thinking budget",
        "logprob_token_ids",
        "more than 64 logprobs",
        "processed logprobs (logprobs_mode processed_logprobs)",
        "float64 Gumbel noise (use_fp64_gumbel) with top-k, top-p or min-p",
        "min-p with top-p on one request",
    ):
        assert cov[name] == name
    for name in ("logprobs", "logprobs with top-k", "float64 Gumbel noise"):
        assert cov[name] is True, (name, cov[name])
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
