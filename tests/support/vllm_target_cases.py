"""The rank body of tests/test_vllm_target_sampler.py: vLLM 0.34's own Model
Runner V2 ``Sampler`` (its Triton kernels interpreted), ``RequestState``,
``ParallelLMHead`` and ``LogitsProcessor`` on gloo TP ranks, against the
plugin's target sampler (localargmax/integrations/vllm/target_sampler.py).
Returns plain data; the tests assert on it.

The head and hidden states hold small multiples of 1/8 and integers, so
every logit (a sum of 32 products) is exact in float32 whatever the order of
accumulation: vLLM's sampler on the gathered logits and the fused step on the
shards see the same values, and the sampled ids must agree exactly (up to the
float32 ``log`` of the noise, which differs in the last ulp at most between
numpy's, in the interpreter, and the C++ op's: far below the score gaps here).
"""

from __future__ import annotations

import logging
import os
import types

import numpy as np
import torch

from tests.support.vllm_common import WarningLog, head_of, patch_interpreted_tl_range, processor, vllm_setup

VOCAB, HIDDEN, MAX_REQS = 1001, 32, 24
TEMPERATURES = (0.0, 0.25, 0.5, 0.7, 1.0, 1.3, 2.0)


def _problem(gen, rows):
    full = (torch.randint(-2, 3, (VOCAB, HIDDEN), generator=gen) / 8).float()
    hidden = torch.randint(-3, 4, (rows, HIDDEN), generator=gen).float()
    return full, hidden


def _fine_problem(gen):
    """A head of multiples of 2**-16 below 2**-6 and integer hidden states in
    [-7, 7]: every logit (|x| < 4, 32 products) is exact in float32 in any
    order, as in _problem, but takes one of ~2**19 values, so a row's top ids
    are rarely tied (the filters' decisions at ties are another matter:
    DESIGN.md, "Filtered sampling")."""
    return (torch.randint(-1024, 1025, (VOCAB, HIDDEN), generator=gen) / 2**16).float()


def _sampler(cfg, vocab, **options):
    """vLLM's ``Sampler`` (``options``: its ``logprobs_mode``, ``use_fp64_gumbel``)."""
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.is_uva_available = lambda: False  # CPU: vLLM's explicit-copy buffers (no pinned memory here)
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.states import RequestState

    states = RequestState(MAX_REQS, 4096, 4096, 0, vocab, torch.device("cpu"))
    return Sampler(cfg, MAX_REQS, vocab, torch.device("cpu"), states, **options)


def _add(sampler, slot, prefill_len=1, **params):
    from vllm.sampling_params import SamplingParams

    sampler.add_request(slot, SamplingParams(**params))
    sampler.req_states.prefill_len.np[slot] = prefill_len
    sampler.req_states.prefill_len.copy_to_uva()
    sampler.apply_staged_writes()


def _batch(slots, positions, seq_lens, num_tokens_per_req=1):
    """vLLM's ``InputBatch`` fields the sampler reads (one logit row per
    request, the last of its ``num_tokens_per_req`` tokens)."""
    n = len(slots)
    logits_indices = torch.arange(n) * num_tokens_per_req + num_tokens_per_req - 1
    pos = torch.zeros(n * num_tokens_per_req, dtype=torch.int64)
    pos[logits_indices] = torch.tensor(positions, dtype=torch.int64)
    idx = torch.tensor(slots, dtype=torch.int64)
    return types.SimpleNamespace(
        num_reqs=n,
        num_draft_tokens=0,
        idx_mapping=idx,
        idx_mapping_np=np.array(slots, dtype=np.intp),
        expanded_idx_mapping=idx,
        expanded_local_pos=torch.zeros(n, dtype=torch.int32),
        cu_num_logits_np=np.arange(n + 1),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32),
        positions=pos,
        logits_indices=logits_indices,
        input_ids=torch.zeros(n * num_tokens_per_req, dtype=torch.int32),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )


class _Model(torch.nn.Module):
    """A target model's ``compute_logits`` as vLLM's decoder models have it."""

    def __init__(self, lm_head, lp):
        super().__init__()
        self.lm_head, self.logits_processor = lm_head, lp

    def compute_logits(self, hidden_states):
        return self.logits_processor(self.lm_head, hidden_states)


def _runner(model, sampler):
    """The ``GPUModelRunner`` attributes its ``sample`` reads (vLLM's own
    ``ModelState.compute_sample_logits``)."""
    from vllm.v1.worker.gpu.model_states.interface import ModelState

    stubs = dict.fromkeys(ModelState.__abstractmethods__, lambda self, *args, **kwargs: None)
    state_cls = type("_State", (ModelState,), {**stubs, "__init__": lambda self: None})
    state = state_cls()
    state.model = model
    return types.SimpleNamespace(
        batch_sharder=None,
        model_state=state,
        model=model,
        sampler=sampler,
        rejection_sampler=None,
        speculator=None,
        structured_outputs_worker=None,
        device=torch.device("cpu"),
        vocab_size=VOCAB,
    )


def _out(o):
    out = {
        "ids": o.sampled_token_ids.tolist(),
        "num_sampled": o.num_sampled.tolist(),
        "num_rejected": o.num_rejected.tolist(),
        "logprobs": o.logprobs_tensors is not None,
        "nans": o.num_nans is not None,
    }
    if o.logprobs_tensors is not None:
        t = o.logprobs_tensors
        out["logprob_ids"] = t.logprob_token_ids.tolist()
        out["logprob_values"] = t.logprobs.tolist()
        out["logprob_dtypes"] = [str(v.dtype) for v in (t.logprob_token_ids, t.logprobs, t.selected_token_ranks)]
        out["ranks"] = t.selected_token_ranks.tolist()
        out["cu"] = t.cu_num_generated_tokens
    return out


def _gathering_head(full, **lp_options):
    """vLLM's ParallelLMHead of ``full`` and a LogitsProcessor that gathers on every rank."""
    head, lp = head_of(full), processor(VOCAB, **lp_options)
    lp.use_all_gather = True  # every rank samples (vLLM's runner on platforms that all-gather)
    return head, lp


def _rng(gen):
    return np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))


def _step_batch(rng, slots):
    """One step's batch of ``slots`` at fresh positions past 2**30 (seq_len = position + 1)."""
    positions = [int(p) for p in rng.integers(0, 2**31 - 2, len(slots))]
    return _batch(slots, positions, [p + 1 for p in positions])


def _sample_routes(ts, *args):
    """``ts.sample_on_shards(*args)`` as plain data, and the target-sampler counters it moved."""
    before = dict(ts.STATS)
    got = _out(ts.sample_on_shards(*args))
    moved = {k: v - before.get(k, 0) for k, v in ts.STATS.items() if v != before.get(k, 0)}
    return got, {k: v for k, v in moved.items() if k.startswith("target")}


def _mixed_case(ts, sampler, head, lp, full, gen, steps=4):
    """Mixed batches (greedy and random rows, every temperature, seeds past
    2**32 and negative, slots out of order, a chunked prefill producing no
    token) through vLLM's Sampler on the gathered logits and the fused step."""
    rng = _rng(gen)
    slots = list(rng.permutation(MAX_REQS)[:20])
    for i, slot in enumerate(slots):
        seed = int(rng.integers(-(2**63), 2**63 - 1)) if i % 3 else int(rng.integers(0, 2**31))
        chunked = i == 7  # seq_len < prefill_len: no token this step
        _add(sampler, int(slot), prefill_len=2**31 - 1 if chunked else 1, temperature=TEMPERATURES[i % 7], seed=seed)
    out = []
    for _ in range(steps):
        positions = [int(p) for p in rng.integers(0, 2**31 - 2, len(slots))]
        seq_lens = [p + 1 for p in positions]
        batch = _batch([int(s) for s in slots], positions, seq_lens, num_tokens_per_req=2)
        hidden = torch.randint(-3, 4, (2 * len(slots), HIDDEN), generator=gen).float()
        logits = hidden[batch.logits_indices] @ full.T  # exact: the gathered logits
        assert ts.covered(batch, sampler) is True
        want = _out(sampler(logits, batch))
        got = _out(ts.sample_on_shards(hidden, head, lp, batch, sampler))
        out.append({"want": want, "got": got, "temperatures": sampler.sampling_states.temperature.np[slots].tolist()})
    return out


FILTERS = (  # (temperature, top_k, top_p, min_p); vLLM's off: top_k 0 (vocab_size), top_p 1, min_p 0
    (0.0, 5, 0.9, 0.1),  # greedy: the filters ignored
    (1.0, 5, 1.0, 0.0),
    (0.7, 40, 1.0, 0.0),
    (1.3, 100, 1.0, 0.0),  # past the 64 candidates a rank sends: the gather fallback
    (1.0, 0, 0.9, 0.0),
    (0.5, 0, 0.5, 0.0),
    (2.0, 0, 0.95, 0.0),
    (1.0, 0, 1.0, 0.05),
    (0.7, 0, 1.0, 0.3),
    (1.0, 20, 0.8, 0.0),
    (1.0, 0, 1.0, 0.0),  # every filter off: the unfiltered step's key
    (1.5, 10, 1.0, 0.02),
)


def _covered_steps(ts, sampler, gen, rng, slots, steps):
    """``steps`` batches of the requests in ``slots``, each with random integer
    hidden states, each asserted covered by the target sampler."""
    for _ in range(steps):
        batch = _step_batch(rng, slots)
        hidden = torch.randint(-7, 8, (len(slots), HIDDEN), generator=gen).float()
        verdict = ts.covered(batch, sampler)
        assert verdict is True, verdict
        yield batch, hidden


def _filtered_case(ts, cfg, gen, steps=3):
    """Mixed batches with top-k / top-p / min-p (and greedy, unfiltered and
    fallback rows) through vLLM's Sampler (its min-p and top-k / top-p
    kernels interpreted, then gumbel_sample) on the gathered logits and the
    fused step on the shards: exact logits (_fine_problem)."""
    patch_interpreted_tl_range()
    full = _fine_problem(gen)
    head, lp = _gathering_head(full)
    sampler = _sampler(cfg, VOCAB)
    rng = _rng(gen)
    slots = [int(s) for s in rng.permutation(MAX_REQS)[: len(FILTERS)]]
    for slot, (t, k, p, mp) in zip(slots, FILTERS):
        params = {"temperature": t, "top_p": p, "min_p": mp, "seed": int(rng.integers(-(2**63), 2**63 - 1))}
        _add(sampler, slot, **params, **({"top_k": k} if k else {}))
    out = []
    for batch, hidden in _covered_steps(ts, sampler, gen, rng, slots, steps):
        want = _out(sampler(hidden @ full.T, batch))
        got = _out(ts.sample_on_shards(hidden, head, lp, batch, sampler))
        tie = _tie_at_boundary(hidden @ full.T, FILTERS)  # where vLLM's top-p may keep a tied id ours drops
        out.append({"want": want, "got": got, "filters": FILTERS, "tie_at_boundary": tie})
    return out


LOGPROB_ROWS = (  # (temperature, logprobs, top_k, top_p); logprobs None: the row asks none
    (0.0, 5, 0, 1.0),
    (1.0, 20, 0, 1.0),
    (0.7, 0, 0, 1.0),
    (1.3, None, 0, 1.0),
    (0.5, 1, 0, 1.0),
    (2.0, 3, 0, 1.0),
    (1.0, None, 0, 1.0),
    (0.0, None, 0, 1.0),
)


def _reference(logits, n):
    """Per row of the gathered float32 ``logits``: float64 ``x - logsumexp(x)``
    (the log-probabilities' reference) and whether the top ``n`` ids are
    decided (no tie at the ``n``-th value)."""
    x = logits.double()
    ref = (x - torch.logsumexp(x, dim=1, keepdim=True)).tolist()
    top = torch.sort(logits, dim=1, descending=True).values
    decided = (top[:, n - 1] != top[:, n]).tolist() if n else [True] * logits.shape[0]
    return ref, decided


def _logprob_case(ts, cfg, gen, mode, filters=False, steps=2):
    """Rows asking logprobs (0, 1, 3, 5, 20 and none; greedy and random;
    with ``filters``, top-k / top-p rows too) through vLLM's Sampler (its
    topk, log-softmax and rank kernels interpreted) on the gathered logits
    and the target sampler on the shards; ``mode`` vLLM's logprobs_mode."""
    patch_interpreted_tl_range()
    full = _fine_problem(gen)
    head, lp = _gathering_head(full)
    sampler = _sampler(cfg, VOCAB, logprobs_mode=mode)
    rng = _rng(gen)
    slots = [int(s) for s in rng.permutation(MAX_REQS)[: len(LOGPROB_ROWS)]]
    for i, (slot, (t, n, k, p)) in enumerate(zip(slots, LOGPROB_ROWS)):
        if filters and i in (1, 2):
            k, p = (8, 1.0) if i == 1 else (0, 0.8)
        params = {"temperature": t, "logprobs": n, "top_p": p, "seed": int(rng.integers(-(2**63), 2**63 - 1))}
        _add(sampler, slot, **params, **({"top_k": k} if k else {}))
    out = []
    for batch, hidden in _covered_steps(ts, sampler, gen, rng, slots, steps):
        logits = lp(head, hidden)  # vLLM's gathered logits (exact here: _fine_problem)
        want = _out(sampler(logits, batch))
        got, routes = _sample_routes(ts, hidden, head, lp, batch, sampler)
        ref, decided = _reference(logits, max(n or 0 for _, n, _, _ in LOGPROB_ROWS))
        out.append({"want": want, "got": got, "ref": ref, "decided": decided, "routes": routes})
    return out


NO_TOP_P = tuple(row for row in FILTERS if row[2] == 1.0 or row[0] == 0.0)
"""FILTERS without top-p on random rows: on bf16 logits (ties everywhere) vLLM's Triton top-p kernel, an
iterative pivot search with a tolerance, can keep ids past the nucleus (a row with top_p 0.5 sampled an id at
cumulative mass 0.73); ours keeps the exact nucleus, so top-p is compared on float32 logits (_filtered_case)."""


def _tie_at_boundary(logits, rows):
    """Per row (``rows``: its FILTERS entry): the last id the filters keep
    ties the first they drop (top-k: vLLM keeps every tied id, ours exactly
    ``k``; top-p: which tied ids vLLM keeps follows its sort's order among
    equal values, ours the smaller ids: DESIGN.md, "Filtered sampling"). The
    allowed set from sampling.filter_sorted (float64, ties to the smaller id)."""
    from localargmax.sampling import filter_sorted

    t, k, p, mp = (torch.tensor(c) for c in zip(*rows))
    t = torch.where(t > 0, t, 1.0).float()
    ys, _, keep, _ = filter_sorted(logits.float(), t, k.long(), p.double(), mp.double())
    n = keep.sum(dim=1)
    tied = [bool(0 < n[b] < ys.shape[1] and ys[b, n[b] - 1] == ys[b, n[b]]) for b in range(len(rows))]
    return [tie and row[0] > 0 for tie, row in zip(tied, rows)]


def _exact_logits_case(ts, cfg, gen, dtype, fp64=False, filters=False, steps=2):
    """A head of ``dtype`` (bf16: vLLM samples the logits rounded to it,
    ties at the top common; a soft-cap and a scale) or vLLM's
    ``use_fp64_gumbel``: the target sampler's shard-logits route against
    vLLM's Sampler on vLLM's own gathered logits, greedy and random rows
    (``filters``: the rows of NO_TOP_P, gather-fallback rows among them)."""
    if filters:
        patch_interpreted_tl_range()
    full = torch.randn(VOCAB, HIDDEN, generator=gen).to(dtype)
    full[VOCAB - 1] = full[0]  # row 0 of every step (below) ties ids 0 and VOCAB - 1 at its top: a tie every run
    head, lp = _gathering_head(full, scale=0.75, soft_cap=20.0)
    sampler = _sampler(cfg, VOCAB, use_fp64_gumbel=fp64)
    rng = _rng(gen)
    slots = [int(s) for s in rng.permutation(MAX_REQS)[: len(NO_TOP_P) if filters else 16]]
    for i, slot in enumerate(slots):
        params = {"temperature": TEMPERATURES[i % 7], "seed": int(rng.integers(-(2**63), 2**63 - 1))}
        if filters:
            t, k, p, mp = NO_TOP_P[i]
            params.update(temperature=t, top_p=p, min_p=mp, **({"top_k": k} if k else {}))
        _add(sampler, slot, **params)
    out = []
    for _ in range(steps):
        batch = _step_batch(rng, slots)
        hidden = (torch.randn(len(slots), HIDDEN, generator=gen) * 2).to(dtype)
        hidden[0] = (2 * full[0].float()).to(dtype)  # ids 0 and VOCAB - 1 score ~2 |w_0|^2, far above the rest
        assert ts.covered(batch, sampler) is True
        logits = lp(head, hidden)
        top2 = torch.topk(logits.float(), 2, dim=1).values
        want = _out(sampler(logits, batch))
        got, routes = _sample_routes(ts, hidden, head, lp, batch, sampler)
        tie = _tie_at_boundary(logits, NO_TOP_P) if filters else [False] * len(slots)
        top_ties = int((top2[:, 0] == top2[:, 1]).sum())
        out.append({"want": want, "got": got, "top_ties": top_ties, "tie_at_k": tie, "routes": routes})
    return out


NAN_ROWS = (  # (temperature, top_k, min_p) per request: greedy and random rows, unfiltered and filtered
    (0.0, 0, 0.0),
    (1.0, 0, 0.0),
    (0.7, 0, 0.0),
    (1.0, 5, 0.0),
    (1.0, 0, 0.1),
)


def _nan_case(ts, cfg, gen, steps=2):
    """vLLM's NaN rule in its Sampler (gumbel_sample drops NaN and draws among
    the finite logits): a head with NaN rows on the first rank's shard alone,
    then on every rank's, through vLLM's Sampler on the gathered logits and
    the target sampler on the shards (issue #67 item 2); with filters (the
    shard-logits route) and without (the fused route)."""
    patch_interpreted_tl_range()
    out = {}
    for where in ("one rank", "every rank", "one rank, no filters", "every rank, no filters"):
        rows = NAN_ROWS[:3] if "no filters" in where else NAN_ROWS  # no filters: the fused route
        full = _fine_problem(gen)
        full[[3, 40]] = float("nan")  # rank 0's shard at every TP size here
        if where.startswith("every rank"):
            full[[VOCAB - 2, VOCAB // 2 + 1]] = float("nan")
        head, lp = _gathering_head(full)
        sampler = _sampler(cfg, VOCAB)
        rng = _rng(gen)
        slots = [int(s) for s in rng.permutation(MAX_REQS)[: len(rows) * 2]]
        for i, slot in enumerate(slots):
            t, k, mp = rows[i % len(rows)]
            params = {"temperature": t, "min_p": mp, "seed": int(rng.integers(-(2**63), 2**63 - 1))}
            _add(sampler, slot, **params, **({"top_k": k} if k else {}))
        steps_out = []
        for _ in range(steps):
            batch = _step_batch(rng, slots)
            hidden = torch.randint(-7, 8, (len(slots), HIDDEN), generator=gen).float()
            assert ts.covered(batch, sampler) is True
            want = _out(sampler(hidden @ full.T, batch))
            got, routes = _sample_routes(ts, hidden, head, lp, batch, sampler)
            nan_ids = full.isnan().any(dim=1).nonzero()[:, 0].tolist()  # the ids this case made NaN
            steps_out.append({"want": want, "got": got, "routes": routes, "nan_ids": nan_ids})
        out[where] = steps_out
    return out


def _coverage_cases(ts, cfg):
    """``covered`` for each feature alone on one random request (among covered ones)."""
    features = {
        "top-k": {"top_k": 5},
        "top-p": {"top_p": 0.9},
        "min-p": {"min_p": 0.1},
        "top-k and top-p": {"top_k": 5, "top_p": 0.9},
        "top-k and min-p": {"top_k": 5, "min_p": 0.1},
        "penalties": {"repetition_penalty": 1.2},
        "top-k with a logit bias": {"top_k": 5, "logit_bias": {3: 1.0}},
        "min-p with top-p on one request": {"min_p": 0.1, "top_p": 0.9},
        "logit bias, bad words or a thinking budget": {"logit_bias": {3: 1.0}},
        "logprobs": {"logprobs": 2},
        "logprobs with top-k": {"logprobs": 2, "top_k": 5},
        "logprob_token_ids": {"logprobs": 2, "logprob_token_ids": [3, 5]},
        "more than 64 logprobs": {"logprobs": 65},
        "processed logprobs (logprobs_mode processed_logprobs)": (
            {"logprobs": 2},
            {"logprobs_mode": "processed_logprobs"},
        ),
        "float64 Gumbel noise (use_fp64_gumbel) with top-k, top-p or min-p": ({"top_k": 5}, {"use_fp64_gumbel": True}),
        "float64 Gumbel noise": ({}, {"use_fp64_gumbel": True}),
    }
    out = {}
    for name, params in features.items():
        params, options = params if isinstance(params, tuple) else (params, {})
        sampler = _sampler(cfg, VOCAB, **options)
        _add(sampler, 0, temperature=0.0, seed=1)
        _add(sampler, 1, temperature=0.8, seed=2, **params)
        out[name] = ts.covered(_batch([0, 1], [3, 4], [4, 5]), sampler)
    sampler = _sampler(cfg, VOCAB)
    _add(sampler, 0, temperature=0.0, top_k=5)  # a greedy row ignores its filters, as vLLM's does
    out["greedy top-k"] = ts.covered(_batch([0], [3], [4]), sampler)
    batch = _batch([0], [3], [4])
    batch.num_draft_tokens = 2
    out["draft tokens"] = ts.covered(batch, sampler)
    out["grammar"] = ts.covered(_batch([0], [3], [4]), sampler, grammar_output=object())
    return out


def _runner_cases(plugin, ts, cfg, head, lp, full, gen):
    """``GPUModelRunner.sample`` as patched: a covered step takes the fused
    path, a step with one logit-bias request vLLM's (counters), both the
    tokens of vLLM's Sampler."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from localargmax.integrations.vllm import patching

    out = {"patched": getattr(GPUModelRunner.sample, "_localargmax", False)}
    sampler = _sampler(cfg, VOCAB)
    runner = _runner(_Model(head, lp), sampler)
    for slot, t in enumerate((0.0, 0.6, 1.0, 1.7)):
        _add(sampler, slot, temperature=t, seed=1000 + slot)
    hidden = torch.randint(-3, 4, (4, HIDDEN), generator=gen).float()
    batch = _batch([0, 1, 2, 3], [10, 11, 12, 2**31 - 5], [11, 12, 13, 2**31 - 4])
    before = dict(plugin.stats())
    out["covered"] = [_out(GPUModelRunner.sample(runner, hidden, batch, None)[0])]
    out["covered_vllm"] = [_out(patching.original(GPUModelRunner, "sample")(runner, hidden, batch, None)[0])]
    out["covered_want"] = [_out(sampler(hidden @ full.T, batch))]
    _add(sampler, 2, temperature=1.0, seed=7, logit_bias={3: 1.0})
    out["uncovered"] = _out(GPUModelRunner.sample(runner, hidden, batch, None)[0])
    out["uncovered_want"] = _out(sampler(hidden @ full.T, batch))
    after = plugin.stats()
    out["stats"] = {
        k: v - before.get(k, 0) for k, v in after.items() if k.startswith("target sampler") and v != before.get(k, 0)
    }
    out["head_found"] = runner.model._localargmax_target_head[1]
    return out


def worker(rank: int, world_size: int, seed: int):
    ctx, cfg = vllm_setup(rank, world_size)
    os.environ["LOCALARGMAX_VLLM_TARGET_SAMPLER"] = "1"
    import localargmax.integrations.vllm as plugin
    from localargmax.integrations.vllm import target_sampler as ts

    warnings = WarningLog("own target sampling runs for")
    logging.getLogger("localargmax.integrations.vllm").addHandler(warnings)
    plugin.install()
    out = {"target_active": ts.active()}
    gen = torch.Generator().manual_seed(seed)
    full, _ = _problem(gen, 1)
    head, lp = _gathering_head(full)
    out["mixed"] = _mixed_case(ts, _sampler(cfg, VOCAB), head, lp, full, gen)
    out["filtered"] = _filtered_case(ts, cfg, gen)
    out["logprobs"] = {
        "raw_logprobs": _logprob_case(ts, cfg, gen, "raw_logprobs"),
        "raw_logits": _logprob_case(ts, cfg, gen, "raw_logits"),
        "raw_logprobs, filters": _logprob_case(ts, cfg, gen, "raw_logprobs", filters=True),
    }
    out["exact"] = {
        "bf16": _exact_logits_case(ts, cfg, gen, torch.bfloat16),
        "bf16, filters": _exact_logits_case(ts, cfg, gen, torch.bfloat16, filters=True, steps=3),
        "fp16": _exact_logits_case(ts, cfg, gen, torch.float16),
        "fp64 noise": _exact_logits_case(ts, cfg, gen, torch.float32, fp64=True),
    }
    out["nan"] = _nan_case(ts, cfg, gen)
    out["coverage"] = _coverage_cases(ts, cfg)
    out["runner"] = _runner_cases(plugin, ts, cfg, head, lp, full, gen)
    out["warnings"] = [m for _, m in warnings.records]
    from vllm.distributed import destroy_model_parallel

    destroy_model_parallel()
    ctx.__exit__(None, None, None)
    return out
