"""The target model's sampling on vLLM 0.34's Model Runner V2 from the head
shards (issue #57, the covered subset), opt-in: ``LOCALARGMAX_VLLM_TARGET_SAMPLER=1``.

vLLM's ``GPUModelRunner.sample`` (v1/worker/gpu/model_runner.py) gathers the
full logits of the sampled rows (``model_state.compute_sample_logits`` ->
``model.compute_logits`` -> ``LogitsProcessor``: an all-gather of ``[B, V/tp]``
per rank) and calls its ``Sampler`` (v1/worker/gpu/sample/sampler.py), which
divides by the temperature in float32 (``apply_sampling_params``) and draws
``gumbel_sample`` with the request's seed (``sampling_states.seeds``) at the
row's position (``input_batch.positions[input_batch.logits_indices]``).
For a step every request of which is covered (:func:`uncovered_reason`:
greedy or random sampling with temperature, top-k, top-p and min-p, nothing
else), :func:`sample_on_shards` draws the same tokens with
:func:`localargmax.lm_head_sample` and vLLM's noise
(:func:`localargmax.vllm_noise`) on each rank's ``ParallelLMHead`` shard in
one exchange (the filters: the filtered step's candidates, and a gather of
the rows they do not decide), and builds the ``SamplerOutput`` ``Sampler.__call__`` builds
(``num_sampled`` / ``num_rejected`` by vLLM's own ``get_num_sampled_and_rejected``).
Any other step runs vLLM's ``sample``; each reason is logged once at WARNING
and counted in ``stats()`` (``"target sampler: fused"`` /
``"target sampler: vLLM's path: <reason>"``). Every input of the decision is
replicated on the TP ranks (the scheduler's per-request sampling state, the
batch's host arrays, the runner's and model's configuration), so every rank
takes the same path.

Token identity with vLLM's ``Sampler`` holds for float32 logits up to the
platform's float32 ``log`` in the noise (DESIGN.md, "vLLM's noise") and the
filters' float32 boundaries (DESIGN.md, "Filtered sampling"); a step with
filters reads on the host whether a row needs the gather fallback (one
device sync per such step, which the unfiltered step does not have); for a
bf16 / fp16 model vLLM samples from logits rounded to the model dtype, the
fused op from the float32 accumulation (the same distribution, not the same
bits at near-ties).
"""

from __future__ import annotations

import torch

from . import logits, patching
from .counters import STATS, logger


def install(release) -> None:
    """Wrap ``GPUModelRunner.sample`` (idempotent); ``release``: the
    versions.Release whose ``target_probes`` passed."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if patching.patched("target"):
        return
    patching.patch("target", GPUModelRunner, "sample", sample)


def uninstall() -> None:
    patching.undo("target")


def active() -> bool:
    return patching.patched("target")


def _fallback(reason: str) -> None:
    key = "target sampler: vLLM's path: " + reason
    if key not in STATS:
        logger.warning(
            "localargmax: vLLM's own target sampling runs for steps with %s (logged once per reason; "
            "localargmax.integrations.vllm.stats() counts the steps)",
            reason,
        )
    STATS[key] += 1


def uncovered_reason(input_batch, sampler, grammar_output=None) -> str | None:
    """Why :func:`sample_on_shards` cannot serve this step of ``sampler``
    (vLLM's v1/worker/gpu ``Sampler``) on ``input_batch`` (vLLM's
    ``InputBatch``), or None. Reads host state only, the same on every TP
    rank: the sampler's configuration and its per-request ``numpy`` arrays
    at ``input_batch.idx_mapping_np``."""
    from vllm.v1.worker.gpu.sample.bad_words import BadWordsState
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState
    from vllm.v1.worker.gpu.sample.penalties import PenaltiesState
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    if type(sampler) is not Sampler:
        return f"a sampler other than vLLM's Sampler ({type(sampler).__name__})"
    if grammar_output is not None:
        return "a grammar bitmask (structured output)"
    if input_batch.num_reqs == 0:
        return "no requests on this rank"
    if getattr(input_batch, "num_draft_tokens", 0):
        return "draft tokens to verify (rejection sampling)"
    if int(input_batch.logits_indices.shape[0]) != int(input_batch.num_reqs):
        return "more than one logit row per request"
    if sampler.compute_nans:
        return "VLLM_COMPUTE_NANS_IN_LOGITS"
    if sampler.return_sampling_mask:
        return "sampling masks (return_sampling_mask)"
    if sampler.trace_replay_state is not None:
        return "trace replay"
    if sampler.use_fp64_gumbel:
        return "float64 Gumbel noise (use_fp64_gumbel)"
    native = (LogitBiasState, PenaltiesState, BadWordsState)
    if len(sampler.logits_processors) != len(native) or any(
        type(p) is not t for p, t in zip(sampler.logits_processors, native)
    ):
        return "custom logits processors"
    idx = input_batch.idx_mapping_np
    if sampler.get_logprobs_dims(idx) is not None:
        return "logprobs"
    states = sampler.sampling_states
    temperature = states.temperature.np[idx]
    if not (temperature >= 0.0).all() or not (temperature < float("inf")).all():
        return "a negative or non-finite temperature"
    random = temperature != 0.0
    if (random & (states.min_p.np[idx] != 0.0) & (states.top_p.np[idx] != 1.0)).any():
        # vLLM's Triton top-k / top-p kernel, after min-p left -inf entries, can drop the smallest id min-p
        # kept where the nucleus needs them all (DESIGN.md, "Filtered sampling"); ours keeps it
        return "min-p with top-p on one request"
    if (sampler.use_flashinfer or sampler.use_xpu_sampler) and _vllm_fused_sampler_eligible(sampler, idx):
        return "top-k / top-p by FlashInfer's or XPU's sampler (its own noise)"
    if sampler.penalties_state.use_penalty[idx].any():
        return "penalties"
    logit_bias, _, bad_words = sampler.logits_processors  # the native three, checked above
    budget = sampler.thinking_budget_state  # its per-request flags exist only when enabled
    if (
        logit_bias.use_logit_bias[idx].any()
        or (bad_words.num_bad_words.np[idx] > 0).any()
        or (budget.enabled and budget.use_thinking_budget[idx].any())
    ):  # (sampler.may_mask_logits also marks the filters, which are covered)
        return "logit bias, bad words or a thinking budget"
    return None


def _filters(states, idx, random):
    """Whether any random row of the step has top-k, top-p or min-p on (vLLM's off: vocab_size, 1, 0)."""
    return bool(
        (random & (states.top_k.np[idx] != states.vocab_size)).any()
        or (random & (states.top_p.np[idx] != 1.0)).any()
        or (random & (states.min_p.np[idx] != 0.0)).any()
    )


def _vllm_fused_sampler_eligible(sampler, idx) -> bool:
    """``Sampler.sample``'s condition for FlashInfer's / XPU's top-k / top-p
    sampler (no greedy row, no per-request seed, top-k or top-p on some row;
    logprobs are refused before this), whose draws are not gumbel_sample's."""
    states = sampler.sampling_states
    on = (states.top_k.np[idx] != states.vocab_size).any() or (states.top_p.np[idx] != 1.0).any()
    return bool(on and not states.any_greedy(idx) and not states.any_explicit_seed(idx))


def covered(input_batch, sampler, grammar_output=None):
    """True when :func:`sample_on_shards` serves the step, else the reason (a str)."""
    reason = uncovered_reason(input_batch, sampler, grammar_output)
    return True if reason is None else reason


def sample_on_shards(hidden_states, lm_head, lp, input_batch, sampler, group=None):
    """vLLM's ``SamplerOutput`` of ``sampler(logits, input_batch)`` where
    ``logits = lp(lm_head, hidden_states[input_batch.logits_indices])``
    (the full logits vLLM's runner gathers), from this rank's ``lm_head``
    shard: every rank calls it and gets the same output.

    ``hidden_states``: the runner's ``[num_tokens, H]`` (rows picked by
    ``logits_indices`` here). ``lm_head``: vLLM's ``ParallelLMHead``; ``lp``:
    its ``LogitsProcessor`` (vocabulary, scale, soft-cap: logits.py rules).
    ``group``: the exchange (default: the head's TP ``GroupCoordinator``
    all-gather, None at TP 1). The step must be covered (:func:`uncovered_reason`)."""
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    from ...sampling import lm_head_sample
    from ...vllm_gumbel import vllm_noise

    rows = input_batch.logits_indices
    hidden = hidden_states[rows]
    start, num_valid, layout_group = logits.layout(lp, lm_head)
    mapping = input_batch.expanded_idx_mapping
    states = sampler.sampling_states
    temperature = states.temperature.gpu[mapping].to(torch.float32)
    seeds = states.seeds.gpu[mapping].to(torch.int64)
    positions = input_batch.positions[rows].to(torch.int64)
    idx = input_batch.idx_mapping_np
    filters = {}
    if _filters(states, idx, states.temperature.np[idx] != 0.0):  # else the unfiltered step (no candidates)
        top_k = states.top_k.gpu[mapping].to(torch.int64)
        filters = {
            "top_k": torch.where(top_k >= states.vocab_size, 0, top_k),  # vLLM's off (vocab_size) as ours (0)
            "top_p": states.top_p.gpu[mapping].to(torch.float32),
            "min_p": states.min_p.gpu[mapping].to(torch.float32),
        }
    sampled = lm_head_sample(
        hidden,
        lm_head.weight,
        temperature=temperature,
        seed=0,
        noise=vllm_noise(seeds, positions),
        vocab_start=start,
        num_valid=num_valid,
        group=layout_group if group is None else group,
        **filters,
        **logits.transform_kwargs(lp),
    )
    num_sampled, num_rejected = get_num_sampled_and_rejected(
        input_batch.seq_lens.new_ones(input_batch.num_reqs),
        input_batch.seq_lens,
        input_batch.cu_num_logits,
        input_batch.idx_mapping,
        sampler.req_states.prefill_len.gpu,
    )
    return SamplerOutput(
        sampled_token_ids=sampled.to(torch.int64).view(-1, 1),
        logprobs_tensors=None,
        num_nans=None,
        num_sampled=num_sampled,
        num_rejected=num_rejected,
        sampling_mask_tensors=None,
    )


def model_head(model, hidden_states):
    """``((lp, lm_head), None)`` when ``model.compute_logits(h)`` is its
    ``logits_processor(lm_head, h)`` unchanged (checked once per model on a
    probe batch: one processor call, on the input itself, output returned
    as is, a vocab-parallel head the fused op serves), else ``(None, why)``.
    Cached on the model."""
    found = getattr(model, "_localargmax_target_head", None)
    if found is None:
        found = _probe_model(model, hidden_states)
        try:
            model._localargmax_target_head = found
        except AttributeError:
            pass
    return found


def _probe_model(model, hidden_states):
    """``model_head``'s verdict, agreed by the TP ranks (a MAX all-reduce of
    "refused" on the TP group's CPU group, as drafters.prepare does): a rank
    whose probe fails takes vLLM's path only if every rank does, so no rank
    runs a collective the others skip."""
    found, reason = _probe_model_here(model, hidden_states)
    from . import drafters

    if drafters.any_rank(reason is not None):
        return None, reason or "another TP rank's probe found its compute_logits differs"
    return found, None


def _probe_model_here(model, hidden_states):
    """This rank's ``((lp, lm_head), None)`` or ``(None, why)``."""
    from . import drafters

    if not patching.patched("drafters"):
        return None, "the LogitsProcessor hook (drafters.py) is not installed"
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(drafters.PROBE_ROWS, hidden_states.shape[-1], generator=gen)
    probe = probe.to(dtype=hidden_states.dtype, device=hidden_states.device)
    with torch.no_grad():
        record, reason = drafters.record_logits(model, probe, 0, False)
    if reason is not None:
        return None, reason
    lp, lm_head, processor_input, bias, _ = record
    if processor_input is not probe:
        return None, "compute_logits transforms the hidden states before its LogitsProcessor"
    if bias is not None:
        return None, "compute_logits passes an embedding bias"
    reason = logits.unsupported_reason(lp, lm_head, probe)
    if reason is not None:
        return None, reason
    weight = lm_head.weight
    if weight.is_cuda and weight.dtype not in (torch.bfloat16, torch.float16):
        return None, f"a {weight.dtype} lm_head on CUDA (vLLM's noise runs on the bf16 / fp16 gemm path there)"
    return (lp, lm_head), None


def runner_reason(runner, hidden_states, input_batch, grammar_output):
    """``((lp, lm_head), None)`` when the fused step serves this
    ``GPUModelRunner.sample`` call, else ``(None, why)``."""
    from vllm.v1.worker.gpu.model_states.interface import ModelState

    if getattr(runner, "batch_sharder", None) is not None:
        return None, "batch-sharded sampling"
    if input_batch.num_draft_tokens and getattr(runner, "rejection_sampler", None) is not None:
        return None, "draft tokens to verify (rejection sampling)"
    state = getattr(runner, "model_state", None)
    if type(state).compute_sample_logits is not ModelState.compute_sample_logits:
        return None, f"a model state with its own compute_sample_logits ({type(state).__name__})"
    reason = uncovered_reason(input_batch, runner.sampler, grammar_output)
    if reason is not None:
        return None, reason
    return model_head(getattr(state, "model", runner.model), hidden_states)  # the model compute_sample_logits calls


def sample(self, hidden_states, input_batch, grammar_output):
    """``GPUModelRunner.sample``: the fused step for a covered step, vLLM's otherwise."""
    heads, reason = runner_reason(self, hidden_states, input_batch, grammar_output)
    if heads is None:
        _fallback(reason)
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        return patching.original(GPUModelRunner, "sample")(self, hidden_states, input_batch, grammar_output)
    STATS["target sampler: fused"] += 1
    lp, lm_head = heads
    out = sample_on_shards(hidden_states, lm_head, lp, input_batch, self.sampler)
    return out, out.num_sampled, out.num_rejected


sample._localargmax = True
