"""Every public op and step under ``torch.compile(fullgraph=True)`` with
``dynamic=True``, ``False`` and ``None``, at batch 0, 1, 3 and 5: the same
answer as eager. The entry points are listed once (ENTRY_POINTS) and the list
is checked against ``localargmax.__all__``, so a new Python-level check that
dynamo cannot trace (``struct.pack`` on a symbolic float broke every op once)
fails here. With a dynamic batch (``mark_dynamic`` or ``dynamic=True``) each
compiles one graph for every batch size >= 2 (dynamo specialises 0 and 1),
in one process and on real gloo ranks (the step's exchange once indexed its
frame at a batch-derived offset: one graph per batch size)."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.utils import counters

import localargmax
from tests.support.launch import run_ranks
from tests.support.problems import integer_problem, layout_kwargs, make_shards
from tests.support.reference import (
    check_against_reference,
    log_prob_tolerance,
    ref_log_odds,
    ref_log_probs,
    ref_logits,
    ref_topk,
)

V, ROWS, H = 90, 96, 16  # 6 padding rows
D2T = torch.arange(V, dtype=torch.int64) % 7  # target ids k + d2t[k]


def _bias():
    return torch.linspace(-1, 1, ROWS)


ENTRY_POINTS = {  # name: f(hidden, weight) -> tensor or tuple of tensors
    "shard_argmax": lambda h, w: localargmax.shard_argmax(h, w, num_valid=V, bias=_bias()),
    "shard_argmax_log_partition": lambda h, w: localargmax.shard_argmax(
        h, w, num_valid=V, log_partition=True, scale=0.5, soft_cap=30.0
    ),
    "shard_topk": lambda h, w: localargmax.shard_topk(h, w, 3, vocab_start=64, num_valid=V),
    "shard_topk_log_partition": lambda h, w: localargmax.shard_topk(h, w, 3, num_valid=V, log_partition=True),
    "shard_sample": lambda h, w: localargmax.shard_sample(h, w, torch.full((h.shape[0],), 0.8), 5, 2, num_valid=V),
    "shard_sample_log_partition": lambda h, w: localargmax.shard_sample(
        h, w, torch.full((h.shape[0],), 0.8), 5, 2, num_valid=V, log_partition=True
    ),
    "merge_keys": lambda h, w: localargmax.merge_keys(
        torch.stack([localargmax.shard_argmax(h, w, num_valid=V)] * 2), D2T
    ),
    "decode_keys": lambda h, w: localargmax.decode_keys(localargmax.shard_topk(h, w, 2, num_valid=V)),
    "lm_head_argmax": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V),
    "lm_head_argmax_all_reduce": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V, reduce="all_reduce"),
    "lm_head_argmax_d2t": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V, d2t=D2T, bias=_bias()),
    "lm_head_argmax_log_probs": lambda h, w: localargmax.lm_head_argmax(
        h, w, num_valid=V, return_log_probs=True, logit_scale=2.0, soft_cap=20.0
    ),
    "lm_head_argmax_log_odds": lambda h, w: localargmax.lm_head_argmax(
        h, w, num_valid=V, return_log_odds=True, temperature=torch.full((h.shape[0],), 0.7), return_log_probs=True
    ),
    "lm_head_topk": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V),
    "lm_head_topk_d2t": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V, d2t=D2T),
    "lm_head_topk_log_probs": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V, return_log_probs=True),
    "lm_head_sample": lambda h, w: localargmax.lm_head_sample(h, w, temperature=0.7, seed=3, num_valid=V),
    "vllm_noise": lambda h, w: localargmax.lm_head_sample(
        h,
        w,
        temperature=0.7,
        seed=0,
        num_valid=V,
        noise=localargmax.vllm_noise(
            torch.arange(h.shape[0]) * 2**33 + 5, torch.arange(h.shape[0]) + 2**31, drafting=True, spec_step=1
        ),
    ),
    "vllm_gumbel_noise": lambda h, w: (
        localargmax.vllm_gumbel_noise(
            torch.arange(h.shape[0]) + 2**40, torch.arange(h.shape[0]), torch.arange(7)[:, None]
        ),
        localargmax.vllm_gumbel_noise(
            torch.arange(h.shape[0]), torch.arange(h.shape[0]), torch.arange(h.shape[0]), fp64=True
        ),
    ),
    "lm_head_sample_all_reduce": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=0.7, seed=3, num_valid=V, reduce="all_reduce"
    ),
    "lm_head_sample_d2t": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=torch.full((h.shape[0],), 1.5), seed=3, num_valid=V, d2t=D2T
    ),
    "lm_head_sample_log_probs": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=0.7, seed=3, num_valid=V, return_log_probs=True, soft_cap=5.0
    ),
    "log_probs_from_pairs": lambda h, w: localargmax.log_probs_from_pairs(
        torch.zeros(h.shape[0]), localargmax.shard_argmax(h, w, num_valid=V, log_partition=True)[1][None]
    ),
    "log_odds_from_pairs": lambda h, w: localargmax.log_odds_from_pairs(
        *(t[None] for t in localargmax.shard_argmax(h, w, num_valid=V, log_partition=True))
    ),
    "StepPlan": lambda h, w: _PLAN[0].run(h),  # the plan _entry made eagerly for w
    "VocabParallelLMHead": lambda h, w: _HEAD(h),
    "LocalArgmaxMixin": lambda h, w: _DRAFT.get_top_tokens(h),
}
_PLAN = [None]  # the StepPlan of the test's weight: a plan is made at load, outside the compiled step


def _entry(name, weight):
    """``ENTRY_POINTS[name]``, with the plan ``StepPlan`` runs made eagerly for ``weight``."""
    if name == "StepPlan":
        _PLAN[0] = localargmax.StepPlan(
            weight, kind="topk", k=3, num_valid=V, d2t=D2T, target_vocab_size=V + 7, return_log_probs=True
        )
    return ENTRY_POINTS[name]


_FULL = torch.randn(V, H)
_HEAD = localargmax.VocabParallelLMHead.from_full(_FULL, 0, 1)


class _Draft(torch.nn.Module, localargmax.LocalArgmaxMixin):
    def __init__(self):
        super().__init__()
        self.lm_head = localargmax.VocabParallelLMHead.from_full(_FULL, 0, 1)
        self.draft_id_to_target_id = D2T
        self.logit_scale = 0.5


_DRAFT = _Draft()
# Public names that are no op or step (types, constants, load-time helpers run once, not per step).
NOT_STEPS = {
    "LOCAL_SHARD", "MAX_GLOBAL_INDEX", "MAX_TOPK", "WITH_CUDA", "VocabShard", "check_layouts", "shard_vocab",
    "build_d2t", "validate_d2t", "draft_to_target_ids", "exchange_keys", "payload_length",
    "kernel_path", "VllmNoise",
}  # fmt: skip


def test_every_public_op_and_step_is_walked():
    walked = {name.split("_log_p")[0].split("_d2t")[0].split("_all_reduce")[0] for name in ENTRY_POINTS}
    assert set(localargmax.__all__) - NOT_STEPS <= walked, set(localargmax.__all__) - NOT_STEPS - walked


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("dynamic", [True, False, None], ids=["dynamic", "static", "auto"])
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_compiles_fullgraph_and_gives_eager_answer(name, dynamic, gen):
    torch._dynamo.reset()
    weight = torch.randn(ROWS, H, generator=gen)
    fn = _entry(name, weight)
    compiled = torch.compile(fn, fullgraph=True, backend="eager", dynamic=dynamic)
    for batch in (0, 1, 3, 5):
        hidden = torch.randn(batch, H, generator=gen)
        got, want = _flat(compiled(hidden, weight)), _flat(fn(hidden, weight))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, f"{name} batch {batch}"
            assert torch.equal(g, w) or (w.is_floating_point() and torch.allclose(g, w, atol=1e-6, equal_nan=True)), (
                f"{name} batch {batch}: {g} != {w}"
            )


# ----------------------------------------------------------------------------- one graph for every batch size

BATCHES = (2, 3, 5, 8)
MODES = ("mark_dynamic", "dynamic")


def _compile_for_every_batch(fn, mode, hiddens, *args):
    """``fn(hidden, *args)`` compiled once (fullgraph, eager backend, the
    batch dynamic by ``mode``) and called for every hidden: (graphs built, outputs)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, backend="eager", dynamic=True if mode == "dynamic" else None)
    outs = []
    for hidden in hiddens:
        if mode == "mark_dynamic":
            torch._dynamo.mark_dynamic(hidden, 0)
        outs.append(_flat(compiled(hidden, *args)))
    return counters["stats"]["unique_graphs"], outs


# The greedy entry points whose ids the float64 reference decides: name -> (ids of the output, bias)
GREEDY = {
    "shard_argmax": (lambda out: localargmax.decode_keys(out[0])[0], _bias),
    "lm_head_argmax": (lambda out: out[0], None),
    "lm_head_argmax_all_reduce": (lambda out: out[0], None),
    "lm_head_argmax_log_probs": (lambda out: out[0], None),
    "lm_head_argmax_log_odds": (lambda out: out[0], None),
    "lm_head_topk": (lambda out: out[0][:, 0], None),
    "lm_head_topk_log_probs": (lambda out: out[0][:, 0], None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_compiles_one_graph_for_every_batch_size(name, mode, gen):
    """One graph for batches 2, 3, 5 and 8, with eager's answer (and, for the
    greedy steps, float64's ids)."""
    weight = torch.randn(ROWS, H, generator=gen)
    fn = _entry(name, weight)
    hiddens = [torch.randn(batch, H, generator=gen) for batch in BATCHES]
    graphs, outs = _compile_for_every_batch(fn, mode, hiddens, weight)
    assert graphs == 1, f"{name} ({mode}): {graphs} graphs for batch sizes {BATCHES}"
    for hidden, got in zip(hiddens, outs):
        want = _flat(fn(hidden, weight))
        for g, w in zip(got, want):
            assert torch.equal(g, w) or (w.is_floating_point() and torch.allclose(g, w, atol=1e-6, equal_nan=True))
        if name in GREEDY:
            ids_of, bias = GREEDY[name]
            b = None if bias is None else bias()[:V]
            check_against_reference(ids_of(got), hidden, weight[:V], b, context=f"{name} batch {hidden.shape[0]}")


TP_VOCAB, TP_H, TP_K, TP_T, TP_SEED = 150, 16, 3, 0.7, 11  # shard_vocab(150, r, 2, 64): 128 and 22 valid rows
TP_STEPS = {  # name: f(hidden, weight, **layout, group) -> tensor or tuple
    "argmax": lambda h, w, **kw: localargmax.lm_head_argmax(h, w, **kw),
    "argmax_all_reduce": lambda h, w, **kw: localargmax.lm_head_argmax(h, w, reduce="all_reduce", **kw),
    "argmax_log_probs_odds": lambda h, w, **kw: localargmax.lm_head_argmax(
        h, w, return_log_probs=True, return_log_odds=True, **kw
    ),
    "topk": lambda h, w, **kw: localargmax.lm_head_topk(h, w, TP_K, **kw),
    "topk_log_probs": lambda h, w, **kw: localargmax.lm_head_topk(h, w, TP_K, return_log_probs=True, **kw),
    "sample": lambda h, w, **kw: localargmax.lm_head_sample(h, w, temperature=TP_T, seed=TP_SEED, **kw),
    "sample_log_probs": lambda h, w, **kw: localargmax.lm_head_sample(
        h, w, temperature=TP_T, seed=TP_SEED, return_log_probs=True, **kw
    ),
}


def _tp_worker(rank, world, shards, hiddens):
    """Every TP step compiled on this gloo rank, per mode: {(step, mode): (graphs, outputs as lists)}."""
    import torch.distributed as dist

    weight, _, shard = shards[rank]
    layout = layout_kwargs(shards[rank])
    out = {}
    for name, step in TP_STEPS.items():
        for mode in MODES:
            fn = lambda h, w, step=step: step(h, w, group=dist.group.WORLD, **layout)  # noqa: E731
            graphs, outs = _compile_for_every_batch(fn, mode, [h.clone() for h in hiddens], weight)
            out[name, mode] = graphs, [[t.tolist() for t in o] for o in outs]
    return out


def test_tp_steps_compile_one_graph_for_every_batch_size_on_gloo_ranks(gen):
    """Two gloo ranks, an uneven vocabulary (128 and 22 valid rows), padding
    that would win, exact ties (across ranks too) and a NaN row: every step
    builds one graph for batches 2, 3, 5 and 8 on each rank, with
    ``mark_dynamic`` and with ``dynamic=True``, and the ranks agree with
    float64 (argmax, top-k, log-probabilities, log-odds; sampling: the eager
    step on the whole unsharded head, tp-invariant)."""
    hiddens, full = [], None
    for batch in BATCHES:
        hidden, weight, _ = integer_problem(gen, batch, TP_VOCAB, TP_H)
        full = weight if full is None else full
        if batch >= 3:
            hidden[1, 0] = math.nan  # a NaN row: every logit NaN, the first id wins
        hiddens.append(hidden)
    shards = make_shards(full, None, 2, 64, hidden=torch.cat(hiddens))
    results = run_ranks(_tp_worker, 2, shards, hiddens, timeout=400)
    for (name, mode), (graphs, outs) in results[0].items():
        assert graphs == 1, f"{name} ({mode}): {graphs} graphs on rank 0 for batch sizes {BATCHES}"
        assert results[1][name, mode][0] == 1, f"{name} ({mode}): {results[1][name, mode][0]} graphs on rank 1"
        for hidden, got, other in zip(hiddens, outs, results[1][name, mode][1]):
            context = f"{name} ({mode}) batch {len(hidden)}"
            got = [torch.tensor(t) for t in got]
            for mine, theirs in zip(got, other):  # every rank the same bits (NaN included)
                torch.testing.assert_close(torch.tensor(theirs), mine, rtol=0, atol=0, equal_nan=True, msg=context)
            _check_tp_step(name, hidden, full, got, context)


def _check_tp_step(name, hidden, full, got, context):
    """One TP step's outputs against float64 on the whole head (sampling: the eager one-rank step)."""
    logits = ref_logits(hidden, full)
    ids = got[0]
    if name.startswith("sample"):
        want = _flat(TP_STEPS[name](hidden, full))
        assert torch.equal(ids, want[0]), f"{context}: {ids.tolist()} != one rank's {want[0].tolist()}"
    elif name.startswith("topk"):
        assert torch.equal(ids, ref_topk(logits, TP_K)), f"{context}: {ids.tolist()}"
    else:
        check_against_reference(ids, hidden, full, context=context, min_clear_fraction=0.0)
        assert torch.equal(ids, logits.argmax(dim=1)), f"{context}: exact logits, exact ids"
    if name.endswith(("log_probs", "log_probs_odds")):
        temperature = torch.full((hidden.shape[0],), TP_T) if name.startswith("sample") else None
        want = ref_log_probs(logits, temperature=temperature).gather(1, ids.reshape(len(ids), -1))
        finite = hidden.isfinite().all(dim=1)  # the NaN row's log-probabilities are NaN either way
        tol = log_prob_tolerance(
            hidden[finite], full, temperature=None if temperature is None else temperature[finite], tp=2
        )
        got_lp = got[1].reshape(want.shape).double()
        assert torch.allclose(got_lp, want, atol=tol, rtol=0, equal_nan=True), f"{context}: {got_lp} != {want}"
    if name.endswith("odds"):
        want = ref_log_odds(logits, ids)
        assert torch.allclose(got[2].double(), want, atol=1e-5, rtol=1e-5, equal_nan=True), f"{context}: log-odds"
