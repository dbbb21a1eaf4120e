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
greedy or random sampling with temperature, top-k, top-p, min-p and raw
logprobs, nothing else), :func:`sample_on_shards` draws the same tokens on
each rank's ``ParallelLMHead`` shard with vLLM's noise
(:func:`localargmax.vllm_noise`) and exchanges a few words per row instead
of the logits, then builds the ``SamplerOutput`` ``Sampler.__call__`` builds
(``num_sampled`` / ``num_rejected`` by vLLM's own
``get_num_sampled_and_rejected``, logprobs by :func:`shard_logprobs`). Any
other step runs vLLM's ``sample``; each reason is logged once at WARNING
and counted in ``stats()`` (``"target sampler: fused"``, ``"target
sampler: shard logits"``, ``"target sampler: vLLM's path: <reason>"``).
Every input of the decision is replicated on the TP ranks (the scheduler's
per-request sampling state, the batch's host arrays, the runner's and
model's configuration), so every rank takes the same path.

Token identity with vLLM's ``Sampler``: the shard-logits route scores
vLLM's own logits bits (bf16 / fp16 heads, ``use_fp64_gumbel``, logprob
steps), equal up to the platform's ``log`` in the noise (DESIGN.md, "vLLM's
noise"); the fused route (float32 heads without logprobs) scores the fused
kernel's float32 dots, which differ from vLLM's gemm in the last bits (a
token can differ at a near-tie of that size). Both decide the filters in
float64 (DESIGN.md, "Filtered sampling": their float32 boundaries, exact
ties at the boundary). A step with filters reads on the host whether a row
needs the gather fallback (one device sync per such step). NaN logits are
dropped as vLLM's ``gumbel_sample`` drops them (greedy rows too): a row
draws among its other logits (the draft side's steps keep DESIGN.md's rule,
NaN wins, which is vLLM's ``get_top_tokens``).
"""

from __future__ import annotations

import math

import torch

from . import logits, patching
from .counters import STATS, fallback

RAW_LOGPROBS_MODES = ("raw_logprobs", "raw_logits")
"""vLLM's ``logprobs_mode`` values the target sampler serves (logprobs of the raw logits)."""

MAX_LOGPROBS = 64
"""The most logprobs per row the target sampler serves (vLLM's ``SamplingParams.logprobs``;
each rank sends ``2 * num_logprobs + 5`` float64 words per row, beside the sample's exchange)."""


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
    native = (LogitBiasState, PenaltiesState, BadWordsState)
    if len(sampler.logits_processors) != len(native) or any(
        type(p) is not t for p, t in zip(sampler.logits_processors, native)
    ):
        return "custom logits processors"
    idx = input_batch.idx_mapping_np
    dims = sampler.get_logprobs_dims(idx)
    if dims is not None:
        num_logprobs, custom_ids = dims
        if custom_ids:
            return "logprob_token_ids"
        if sampler.logprobs_mode not in RAW_LOGPROBS_MODES:
            return f"processed logprobs (logprobs_mode {sampler.logprobs_mode})"
        if num_logprobs > MAX_LOGPROBS:
            return f"more than {MAX_LOGPROBS} logprobs"
        if num_logprobs > sampler.sampling_states.vocab_size:
            return "more logprobs than the vocabulary holds"
    states = sampler.sampling_states
    temperature = states.temperature.np[idx]
    if not (temperature >= 0.0).all() or not (temperature < float("inf")).all():
        return "a negative or non-finite temperature"
    random = temperature != 0.0
    if sampler.use_fp64_gumbel and _filters(states, idx, random):
        return "float64 Gumbel noise (use_fp64_gumbel) with top-k, top-p or min-p"
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
    processed logprobs are refused before this), whose draws are not gumbel_sample's."""
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
    all-gather, None at TP 1). The step must be covered (:func:`uncovered_reason`).

    Two routes, counted in ``stats()``: ``"target sampler: fused"``, the
    fused op on the shard (float32 heads without filters, logprobs or
    ``use_fp64_gumbel``; vLLM's noise makes its kernel drop NaN), and
    ``"target sampler: shard logits"`` for the other covered steps: vLLM's own ``LogitsProcessor`` on the shard
    (``skip_gather``: the bits vLLM gathers, rounded to the model dtype as
    vLLM's are), then vLLM's score per id and one ``(score, id)`` pair per
    row exchanged (:func:`shard_logits_sample`), or with filters the
    filtered step on those logits (``filtered_sample(shard_logits=)``).
    Logprobs (vLLM's ``raw_logprobs`` / ``raw_logits``, at most
    :data:`MAX_LOGPROBS`) come from the same shard logits
    (:func:`shard_logprobs`)."""
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    from ...sampling import filtered_sample, lm_head_sample
    from ...sampling.noise import vllm_noise

    rows = input_batch.logits_indices
    hidden = hidden_states[rows]
    start, num_valid, layout_group = logits.layout(lp, lm_head)
    group = layout_group if group is None else group
    mapping = input_batch.expanded_idx_mapping
    states = sampler.sampling_states
    temperature = states.temperature.gpu[mapping].to(torch.float32)
    noise = vllm_noise(states.seeds.gpu[mapping].to(torch.int64), input_batch.positions[rows].to(torch.int64))
    idx = input_batch.idx_mapping_np
    dims = sampler.get_logprobs_dims(idx)
    filtered = _filters(states, idx, states.temperature.np[idx] != 0.0)
    filters = {}
    if filtered:  # else the unfiltered step (no candidates)
        top_k = states.top_k.gpu[mapping].to(torch.int64)
        filters = {
            "top_k": torch.where(top_k >= states.vocab_size, 0, top_k),  # vLLM's off (vocab_size) as ours (0)
            "top_p": states.top_p.gpu[mapping].to(torch.float32),
            "min_p": states.min_p.gpu[mapping].to(torch.float32),
        }
    local = None
    step = {"temperature": temperature, "seed": 0, "noise": noise, "vocab_start": start, "num_valid": num_valid}
    step["group"] = group
    if filtered or dims is not None or sampler.use_fp64_gumbel or lm_head.weight.dtype != torch.float32:
        STATS["target sampler: shard logits"] += 1
        local = lp(lm_head, hidden, skip_gather=True)[:, :num_valid]  # vLLM's own shard logits, padding cut
        if filtered:  # (never with use_fp64_gumbel: uncovered_reason); NaN dropped, as vLLM's gumbel_sample
            dropped = local.masked_fill(local.isnan(), -math.inf)
            sampled = filtered_sample(hidden, lm_head.weight, shard_logits=dropped, **step, **filters)
        else:
            sampled = shard_logits_sample(local, start, temperature, noise, group, fp64=sampler.use_fp64_gumbel)
    else:  # unfiltered (filtered steps take the shard logits above)
        STATS["target sampler: fused"] += 1
        sampled = lm_head_sample(hidden, lm_head.weight, **step, **logits.transform_kwargs(lp)).to(torch.int64)
    logprobs_tensors = None
    if dims is not None:
        logprobs_tensors = shard_logprobs(
            local, start, sampled, dims[0], group, logits_mode=sampler.logprobs_mode == "raw_logits"
        )
    num_sampled, num_rejected = get_num_sampled_and_rejected(
        input_batch.seq_lens.new_ones(input_batch.num_reqs),
        input_batch.seq_lens,
        input_batch.cu_num_logits,
        input_batch.idx_mapping,
        sampler.req_states.prefill_len.gpu,
    )
    return SamplerOutput(
        sampled_token_ids=sampled.view(-1, 1),
        logprobs_tensors=logprobs_tensors,
        num_nans=None,
        num_sampled=num_sampled,
        num_rejected=num_rejected,
        sampling_mask_tensors=None,
    )


def _gather_rows(values: torch.Tensor, group, vocab_start: int) -> torch.Tensor:
    """Every rank's ``[B, W]`` float64 ``values``: ``[tp, B, W]`` (one
    all-gather of the bits through :func:`localargmax.collective.exchange_step`:
    the group checked first, the ranks' shapes compared under
    ``LOCALARGMAX_DEBUG=1``)."""
    from ... import envs
    from ...collective import exchange_step

    words = values.contiguous().view(torch.int64).reshape(-1)
    debug = None
    if envs.LOCALARGMAX_DEBUG:
        debug = {"target sampler rows": values.shape[0], "words per row": values.shape[1]}
    return exchange_step(words, group, vocab_start=vocab_start, debug=debug).view(torch.float64).view(-1, *values.shape)


def shard_logits_sample(local, start, temperature, noise, group, *, fp64=False):
    """vLLM's ``gumbel_sample`` over the full logits, from this rank's slice.

    Args:
        local: ``[B, n]`` this rank's logits for global ids ``[start, start +
            n)`` in vLLM's dtype (its gathered values, bit for bit; ``n`` may
            be 0).
        temperature: ``[B]`` float32 (0: greedy). noise: vLLM's
            :class:`localargmax.VllmNoise` for the rows. group: the exchange.
        fp64: vLLM's ``use_fp64_gumbel`` (float64 noise, float64 score).

    Returns:
        ``[B]`` int64 global ids on every rank: per row the largest
        ``fl(x / T) + g`` (``x`` at ``T = 0``), float32 or (``fp64``)
        float64 as vLLM's ``gumbel_noised_argmax``; ties to the smaller id;
        NaN logits dropped, as vLLM's ``gumbel_sample`` drops them (a row of
        NaN and ``-inf`` alone: its smallest id). One ``(score, id)``
        float64 pair per row per rank crosses the exchange."""
    from ...sampling.noise import vllm_gumbel_noise

    batch, n = local.shape
    x = local.to(torch.float32)
    x = x.masked_fill(x.isnan(), -math.inf)  # vLLM's gumbel_sample: NaN never wins
    random = temperature != 0.0
    y = torch.where(random[:, None], x / torch.where(random, temperature, 1.0)[:, None], x)
    if fp64:
        y = y.to(torch.float64)
    if n and bool(random.any()):
        ids = torch.arange(start, start + n, device=x.device)[None]
        g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids, fp64=fp64)
        y = torch.where(random[:, None], y + g, y)
    if n:
        best = torch.argmax(y, dim=1)  # the first maximum (no NaN: x has none, nor has the noise)
        pair = torch.stack([y.gather(1, best[:, None])[:, 0].to(torch.float64), (best + start).to(torch.float64)], 1)
    else:  # an empty shard: never the winner
        pair = torch.tensor([-math.inf, math.inf], dtype=torch.float64, device=x.device).expand(batch, 2)
    gathered = _gather_rows(pair, group, start)  # [tp, B, 2]
    score, gid = gathered[..., 0], gathered[..., 1]
    wins = (score == score.max(dim=0).values) & (gid < math.inf)
    return torch.where(wins, gid, math.inf).min(dim=0).values.to(torch.int64)


def shard_logprobs(local, start, sampled, num_logprobs, group, *, logits_mode=False):
    """vLLM's ``LogprobsTensors`` (``compute_topk_scores(logits,
    num_logprobs, sampled)`` of v1/worker/gpu/sample/logprob.py on the
    gathered raw logits) from this rank's slice, in two exchanges of
    ``O(num_logprobs)`` words per row.

    Args:
        local: ``[B, n]`` this rank's logits for global ids ``[start, start
            + n)``, vLLM's bits (model dtype). sampled: ``[B]`` int64 global
            ids (the same on every rank). num_logprobs: the top ids per row,
            ``0 <= num_logprobs <= MAX_LOGPROBS``. group: the exchange.
        logits_mode: vLLM's ``raw_logits`` (the logits themselves) instead
            of ``raw_logprobs``.

    Returns:
        ``LogprobsTensors(ids [B, 1 + num_logprobs] int64 (the sampled id,
        then the top ids by logit, ties to the smaller id), logprobs [B, 1 +
        num_logprobs] float32 (``(x - max) - log Σ exp(x - max)``, vLLM's order of
        operations, in float64, rounded once; vLLM computes it in float32), ranks
        [B] int64 (the number of ids whose logit is ``>= x[sampled]``),
        None)``. The top ids follow the packed key's order (a NaN first, ties
        to the smaller id; ``torch.topk``'s order among ties is unspecified);
        they travel as packed keys, so a shard with fewer than
        ``num_logprobs`` entries sends key 0 (below every real key, ``-inf``
        included), never a fake id. A shard row that is all ``-inf`` adds
        nothing; every rank all ``-inf``: every log-probability NaN (as
        ``torch.log_softmax``); a NaN logit anywhere: NaN."""
    from vllm.v1.outputs import LogprobsTensors

    from ...ops import decode_keys
    from ...packed_key import NO_ENTRY_STANDIN, pack_keys, top_keys
    from ...sampling.logprobs import log_prob_of, merge_partitions, shard_partition

    batch, n = local.shape
    x = local.to(torch.float32)
    dev = x.device
    m = min(num_logprobs, n)
    # per row: [max, sum exp(x - max), owns the sampled id, x[sampled], the top m packed keys as their bits (key 0:
    # no entry, below every real key)]
    stats = torch.zeros((batch, 4 + num_logprobs), dtype=torch.float64, device=dev)
    stats[:, 0] = -math.inf
    stats[:, 3] = -math.inf
    if n:
        xd = x.to(torch.float64)
        stats[:, 0], stats[:, 1] = shard_partition(xd)  # an all -inf shard row adds 0; NaN and +inf propagate
        own = (sampled >= start) & (sampled < start + n)
        stats[:, 2] = own.to(torch.float64)
        stats[:, 3] = torch.where(own, xd.gather(1, (sampled - start).clamp(0, n - 1)[:, None])[:, 0], -math.inf)
        if m:  # the packed-key order: NaN first, then larger values, ties to the smaller id
            ids = torch.arange(start, start + n, device=dev).expand(batch, n)
            keys = top_keys(pack_keys(x, ids), m, dim=1)
            stats[:, 4 : 4 + m] = keys.view(torch.float64)
    g = _gather_rows(stats, group, start)  # [tp, B, W]
    total_max, total = merge_partitions(g[..., 0], g[..., 1])  # every rank all -inf: the sum is 0
    x_sampled = torch.where(g[..., 2] == 1.0, g[..., 3], -math.inf).amax(dim=0)  # the owner's (keeps -0.0)
    tp = g.shape[0]
    cand = g[..., 4:].contiguous().view(torch.int64).permute(1, 0, 2).reshape(batch, tp * num_logprobs)
    top = top_keys(cand, num_logprobs, dim=1) if num_logprobs else cand[:, :0]
    top_i, top_v = decode_keys(torch.where(top == 0, NO_ENTRY_STANDIN, top))  # no key 0 with num_logprobs <= vocab
    ids = torch.cat([sampled[:, None], top_i], dim=1)
    values = torch.cat([x_sampled[:, None], top_v.to(torch.float64)], dim=1)
    # vLLM's order of operations, (x - max) - log sum exp(x - max): a tie at |max| ~ 3e38 keeps its log 2
    scores = values if logits_mode else log_prob_of(values, total_max[:, None], total[:, None])
    count = ((x >= x_sampled[:, None].to(torch.float32)).sum(dim=1) if n else torch.zeros(batch, device=dev)).double()
    ranks = _gather_rows(count[:, None], group, start)[..., 0].sum(dim=0).to(torch.int64)
    return LogprobsTensors(
        logprob_token_ids=ids,
        logprobs=scores.to(torch.float32),
        selected_token_ranks=ranks,
        cu_num_generated_tokens=None,
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
        fallback(reason, key="target sampler: vLLM's path: ", what="target sampling", unit="steps")
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        return patching.original(GPUModelRunner, "sample")(self, hidden_states, input_batch, grammar_output)
    lp, lm_head = heads
    out = sample_on_shards(hidden_states, lm_head, lp, input_batch, self.sampler)
    return out, out.num_sampled, out.num_rejected


sample._localargmax = True
