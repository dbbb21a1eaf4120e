"""The planned step (DESIGN.md, "The planned step"): what one call dispatches,
counted with a TorchDispatchMode on the device code path (``host_checks``
returning False, as on CUDA), against the budgets of issue #65; the plan's
own checks; its answers against float64 at TP 1 and over gloo at TP 2 and 3;
torch.compile (fullgraph, one graph for every batch) and CUDA graph capture."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

import localargmax
from localargmax import StepPlan, _validation
from localargmax.reference import reference_argmax, reference_logits
from tests.support.launch import run_ranks
from tests.support.problems import make_shards

BUDGETS = {
    "argmax": 4,
    "sample": 4,
    "topk": 5,
    "argmax_log_probs": 5,
    "argmax_log_odds": 5,
    "sample_log_probs": 5,
    "topk_log_probs": 5,
}
"""Dispatched ops per step on the device path: kernel, collective, merge, the async check (#65)."""

ALLOCATING = ("empty", "zeros", "ones", "full", "new_", "_to_copy", "clone", "cat", "stack")


class OpCounter(TorchDispatchMode):
    """Records the name of every op dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def counted(fn):
    with OpCounter() as c:
        out = fn()
    return c.ops, out


@pytest.fixture
def device_path(monkeypatch):
    """The step's device code path on CPU tensors: checks folded into the async flag, as on CUDA."""
    monkeypatch.setattr(_validation, "host_checks", lambda t: False)


def _problem(gen, batch=5, vocab=300, hsize=32, tp=1):
    hidden = torch.randn(batch, hsize, generator=gen)
    weight = torch.randn(vocab, hsize, generator=gen)
    return hidden, weight, make_shards(weight, None, tp, 64, hidden=hidden)


def _step_calls(hidden, w, s, group=None):
    """Each step kind of the budget table as a functional call on one shard."""
    kw = {"vocab_start": s.vocab_start, "num_valid": s.num_valid, "group": group}
    t = torch.full((hidden.shape[0],), 0.8)
    return {
        "argmax": lambda: localargmax.lm_head_argmax(hidden, w, **kw),
        "sample": lambda: localargmax.lm_head_sample(hidden, w, temperature=t, seed=3, **kw),
        "topk": lambda: localargmax.lm_head_topk(hidden, w, 4, **kw),
        "argmax_log_probs": lambda: localargmax.lm_head_argmax(hidden, w, return_log_probs=True, **kw),
        "argmax_log_odds": lambda: localargmax.lm_head_argmax(hidden, w, return_log_odds=True, temperature=t, **kw),
        "sample_log_probs": lambda: localargmax.lm_head_sample(
            hidden, w, temperature=t, seed=3, return_log_probs=True, **kw
        ),
        "topk_log_probs": lambda: localargmax.lm_head_topk(hidden, w, 4, return_log_probs=True, **kw),
    }


def _plans(w, s, group=None, max_batch=8):
    kw = {"vocab_start": s.vocab_start, "num_valid": s.num_valid, "group": group, "max_batch": max_batch}
    return {
        "argmax": StepPlan(w, **kw),
        "sample": StepPlan(w, kind="sample", **kw),
        "topk": StepPlan(w, kind="topk", k=4, **kw),
        "argmax_log_probs": StepPlan(w, return_log_probs=True, **kw),
        "argmax_log_odds": StepPlan(w, return_log_odds=True, **kw),
        "sample_log_probs": StepPlan(w, kind="sample", return_log_probs=True, **kw),
        "topk_log_probs": StepPlan(w, kind="topk", k=4, return_log_probs=True, **kw),
    }


def _run(plan, name, hidden, t):
    """One planned call of the step ``name`` (``t``: the per-row temperature, made before any count)."""
    if name.startswith("sample"):
        return plan.run(hidden, temperature=t, seed=3)
    if name == "argmax_log_odds":
        return plan.run(hidden, temperature=t)
    return plan.run(hidden)


@pytest.mark.parametrize("name", list(BUDGETS))
def test_functional_step_dispatches_within_budget(name, gen, device_path):
    hidden, weight, shards = _problem(gen)
    w, _, s = shards[0]
    ops, out = counted(_step_calls(hidden, w, s)[name])
    assert len(ops) <= BUDGETS[name], f"{name}: {len(ops)} ops > {BUDGETS[name]}: {ops}"
    assert "_assert_async" in ops, "the device path checks the exchange with one asynchronous assert"
    ids = out if isinstance(out, torch.Tensor) else out[0]
    if name == "argmax" or name.startswith("argmax_"):
        assert torch.equal(ids, reference_argmax(hidden, weight))


@pytest.mark.parametrize("name", list(BUDGETS))
def test_planned_step_steady_state_allocates_nothing(name, gen, device_path):
    hidden, weight, shards = _problem(gen)
    w, _, s = shards[0]
    plan, t = _plans(w, s)[name], torch.full((hidden.shape[0],), 0.8)
    first = _run(plan, name, hidden, t)
    ops, again = counted(lambda: _run(plan, name, hidden, t))
    assert len(ops) <= BUDGETS[name], f"{name}: {len(ops)} ops > {BUDGETS[name]}: {ops}"
    assert not [op for op in ops if op.startswith(ALLOCATING)], f"{name} allocates in steady state: {ops}"
    for a, b in zip(first if isinstance(first, tuple) else (first,), again if isinstance(again, tuple) else (again,)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["argmax", "sample"])
def test_host_path_dispatches_at_most_half_of_the_eager_checks(name, gen):
    """The host path (CPU tensors) raises from the merge itself: no separate check ops (was 15 and 22)."""
    hidden, weight, shards = _problem(gen)
    w, _, s = shards[0]
    ops, _ = counted(_step_calls(hidden, w, s)[name])
    assert len(ops) <= {"argmax": 7, "sample": 11}[name], ops
    assert "_assert_async" not in ops


def test_plan_refuses_at_plan_time(gen):
    w = torch.randn(64, 8)
    with pytest.raises(ValueError, match="kind"):
        StepPlan(w, kind="greedy")
    with pytest.raises(ValueError, match="k is top-k's"):
        StepPlan(w, k=4)
    with pytest.raises(ValueError, match="init_process_group"):
        StepPlan(w, vocab_start=64)
    with pytest.raises(ValueError, match="exceeds the valid vocabulary"):
        StepPlan(w, kind="topk", k=8, num_valid=4)
    with pytest.raises(ValueError, match="all_gather"):
        StepPlan(w, return_log_probs=True, reduce="all_reduce")
    with pytest.raises(ValueError, match="max_batch"):
        StepPlan(w, max_batch=-1)
    with pytest.raises(ValueError, match="d2t maps draft id 3"):
        d2t = torch.zeros(64, dtype=torch.int64)
        d2t[3] = 1000
        StepPlan(w, d2t=d2t, target_vocab_size=100)
    plan = StepPlan(w, max_batch=4)
    with pytest.raises(ValueError, match="max_batch=4"):
        plan.run(torch.randn(5, 8))
    with pytest.raises(TypeError, match="hidden dtype"):
        plan.run(torch.randn(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="hidden_size"):
        plan.run(torch.randn(2, 9))


def _d2t_to(vocab, winner_ids, target):
    """A d2t that sends the rows' winners to ``target`` (negative or past the target vocabulary)."""
    d2t = torch.zeros(vocab, dtype=torch.int64)
    d2t[winner_ids] = target - winner_ids
    return d2t


@pytest.mark.parametrize("target", [-1, -1000, 300, 10**6])
@pytest.mark.parametrize("step", ["argmax", "topk", "sample"])
def test_d2t_that_maps_outside_the_target_vocabulary_is_an_error(target, step, gen, monkeypatch):
    """A mapped id < 0 is an error on every path; >= target_vocab_size where the plan knows it (#67 item 4)."""
    hidden, weight, _ = _problem(gen, vocab=200)
    winners = reference_argmax(hidden, weight)
    d2t = _d2t_to(200, winners, target)
    call = {
        "argmax": lambda p: p.run(hidden),
        "topk": lambda p: p.run(hidden),
        "sample": lambda p: p.run(hidden, temperature=0.0, seed=1),
    }[step]
    kind = {"kind": step, "k": 2} if step == "topk" else {"kind": step}
    plan = StepPlan(weight, d2t=d2t, **kind)  # no target size known: only negative ids are refused
    if target < 0:
        with pytest.raises(ValueError, match=r"d2t maps draft id \d+ to target id -\d+"):
            call(plan)
        monkeypatch.setattr(_validation, "host_checks", lambda t: False)
        with pytest.raises(RuntimeError, match="invalid key exchange or token id"):
            call(plan)
        return
    call(plan)  # a known-good step without the target size
    good = torch.zeros(200, dtype=torch.int64)
    plan = StepPlan(weight, d2t=good, target_vocab_size=300, **kind)
    good.copy_(d2t)  # the table changed after load: the merge checks the ids again
    with pytest.raises(ValueError, match=r"outside the target vocabulary \[0, 300\)"):
        call(plan)
    monkeypatch.setattr(_validation, "host_checks", lambda t: False)
    with pytest.raises(RuntimeError, match="invalid key exchange or token id"):
        call(plan)


@pytest.mark.parametrize("batch", [0, 1, 7])
def test_plan_matches_float64_with_planted_hard_cases(batch, gen):
    """Ties across shards, NaN, an all -inf row, padding that would win, an empty shard: TP 1 over the full head."""
    hidden, weight = torch.randn(batch, 16, generator=gen), torch.randn(130, 16, generator=gen)
    if batch:
        weight[128] = weight[5]  # an exact tie across the shard boundary at 128: 5 wins
        hidden[0] = weight[5] * 3
    if batch > 2:
        weight[77, 0] = float("nan")
        hidden[2, 0] = 1.0
    plan = StepPlan(weight, max_batch=8)
    ids = plan.run(hidden)
    assert torch.equal(ids, reference_argmax(hidden, weight))
    if batch > 2:
        assert int(ids[2]) == 77
    ids, values = StepPlan(weight, kind="topk", k=3).run(hidden)
    ref = reference_logits(hidden, weight)
    if batch:
        assert torch.equal(ids[:, 0], reference_argmax(hidden, weight))
        finite = ref[:, :1].isfinite().all(dim=1) & ~ref.isnan().any(dim=1)
        assert torch.allclose(values[finite].double(), ref[finite].gather(1, ids[finite]), rtol=1e-5, atol=1e-4)
    else:
        assert ids.shape == (0, 3)


def test_compiled_plan_is_one_graph_for_every_batch(gen):
    hidden, weight, _ = _problem(gen, batch=9)
    for plan in (StepPlan(weight), StepPlan(weight, return_log_probs=True), StepPlan(weight, kind="topk", k=3)):
        counters.clear()
        compiled = torch.compile(plan.run, fullgraph=True, backend="aot_eager", dynamic=True)
        for b in (2, 5, 9):
            got, want = compiled(hidden[:b]), plan.run(hidden[:b])
            for x, y in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert torch.equal(x, y)
        assert counters["stats"]["unique_graphs"] == 1


def _gloo_worker(rank, world, seed):
    """TP ``world`` over gloo: every step kind planned once, run twice; the second call's ops counted on the
    device path; the ids against float64 on the full head."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(6, 32, generator=gen)
    weight = torch.randn(250, 32, generator=gen)
    weight[200] = weight[3]  # a tie across ranks
    w, _, s = make_shards(weight, None, world, 64, hidden=hidden)[rank]
    group = dist.group.WORLD
    _validation.host_checks = lambda t: False
    out, t = {}, torch.full((hidden.shape[0],), 0.8)
    for name, plan in _plans(w, s, group=group).items():
        first = _run(plan, name, hidden, t)
        ops, again = counted(lambda: _run(plan, name, hidden, t))
        out[name] = (ops, (first if isinstance(first, tuple) else (first,))[0].tolist(), [x.tolist() for x in again])
    for reduce in ("all_gather", "all_reduce"):
        plan = StepPlan(w, vocab_start=s.vocab_start, num_valid=s.num_valid, group=group, reduce=reduce, max_batch=8)
        plan.run(hidden)
        ops, ids = counted(lambda: plan.run(hidden))
        out[reduce] = (ops, ids.tolist())
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_planned_step_over_gloo_within_budget(world, seed):
    outs = run_ranks(_gloo_worker, world, seed)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(6, 32, generator=gen)
    weight = torch.randn(250, 32, generator=gen)
    weight[200] = weight[3]
    want = reference_argmax(hidden, weight).tolist()
    for out in outs:
        assert out == outs[0], "every rank returns the same"
        for name, (ops, first, _) in ((n, out[n]) for n in BUDGETS):
            assert len(ops) <= BUDGETS[name], f"{name}: {ops}"
            assert not [op for op in ops if op.startswith(ALLOCATING)], f"{name}: {ops}"
            if name.startswith("argmax"):
                assert first == want
            if name.startswith("topk"):
                assert [row[0] for row in first] == want
        for reduce in ("all_gather", "all_reduce"):
            ops, ids = out[reduce]
            assert len(ops) <= BUDGETS["argmax"], ops
            assert ids == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graph capture needs one")
@pytest.mark.parametrize("batch", [1, 8, 64, 512])
def test_cuda_graph_captures_the_planned_step(batch):
    """vLLM's way: one graph per batch size, replayed with new hidden states and per-row temperatures."""
    gen = torch.Generator(device="cuda").manual_seed(batch)
    weight = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    d2t = torch.zeros(4096, dtype=torch.int64, device="cuda")
    for kind in ("argmax", "sample", "topk"):
        plan = StepPlan(weight, kind=kind, k=4 if kind == "topk" else 1, d2t=d2t, max_batch=512)
        hidden = torch.randn(batch, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        t = torch.full((batch,), 0.7, device="cuda")
        call = (lambda: plan.run(hidden, temperature=t, seed=5)) if kind == "sample" else (lambda: plan.run(hidden))
        call()  # warm-up: the plan's buffers, the kernels' first launch
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        for _ in range(3):
            hidden.copy_(torch.randn(batch, 256, device="cuda", dtype=torch.bfloat16, generator=gen))
            t.uniform_(0.1, 2.0, generator=gen)
            graph.replay()
            want = call()
            got = out if isinstance(out, tuple) else (out,)
            for x, y in zip(got, want if isinstance(want, tuple) else (want,)):
                assert torch.equal(x, y)
        torch.cuda.synchronize()
