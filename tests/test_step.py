"""step.py: lm_head_argmax (and the shared behaviour of lm_head_topk /
lm_head_sample) as a whole step: real gloo ranks (tp = 1..4, both reduce
modes, d2t, ties across ranks, NaN on a later rank, padding that would win,
empty shards, batch == tp and batch 0), simulated ranks on exact data, world
size 1, torch.compile, CUDA graphs and devices; empty batches, H = 0, no
valid vocabulary and the index boundary at every entry point."""

from __future__ import annotations

import os

import pytest
import torch

import localargmax
from localargmax.reference import reference_argmax
from tests.support.checks import BAD_D2T, raises_cleanly
from tests.support.keys import allreduce_max, unsigned_max
from tests.support.launch import launch, live_descendants, run_ranks, timed
from tests.support.paths import cuda_only
from tests.support.problems import (
    full_bias,
    integer_problem,
    make_shards,
    planted_problem,
    shard_keys,
    simulated_argmax,
    stack_frames,
)
from tests.support.reference import (
    check_against_reference,
    log_prob_tolerance,
    ref_argmax,
    ref_log_probs,
    ref_logits,
    ref_topk,
    reference_logits_and_error,
)
from tests.support.scenarios import REDUCES, SCENARIO_NAMES, TPS, check_case
from tests.support.strategies import d2t_for, exact_problems, given, layouts, settings, st

H, ROWS, B = 8, 6, 3


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("tp", TPS)
def test_lm_head_argmax_multirank(multirank_run, tp, name, reduce):
    check_case(multirank_run, tp, name, reduce)


def test_scenarios_are_hard_enough(multirank_run):
    """The scenarios really contain what their names promise."""
    _, scenarios, _ = multirank_run

    def layout(name, tp):
        sc = scenarios[name]
        return [s for *_, s in make_shards(sc.weight, sc.bias, tp, sc.pad_to)]

    for tp in (2, 3, 4):
        holders = {
            r
            for r, s in enumerate(layout("ties_across_ranks", tp))
            for c in (300, 520, 700, 998)
            if s.vocab_start <= c < s.vocab_start + s.num_valid
        }
        assert len(holders) >= 2, f"tp={tp}: the tie is not across ranks"
        shards = layout("nan_on_later_rank", tp)
        assert shards[-1].vocab_start <= 990 or shards[-2].vocab_start <= 990
        assert shards[0].vocab_start + shards[0].num_valid <= 990
    for name in ("planted_f16_inf_bias_pad", "padding_would_win_bf16", "all_neg_inf"):
        assert any(s.num_valid < s.rows for s in layout(name, 4)), name
    assert [s.num_valid for s in layout("padding_would_win_bf16", 4)] == [32, 32, 6, 0]
    assert scenarios["batch_equals_tp"].hidden.shape[0] == 4 and scenarios["batch_zero"].hidden.shape[0] == 0


def _topk_sample_worker(rank, world_size, seed):
    import torch.distributed as dist

    hidden, weight, _ = integer_problem(torch.Generator().manual_seed(seed), 5, 333, 11)
    w, _, s = make_shards(weight, None, world_size, 64, hidden=hidden)[rank]
    kw = dict(vocab_start=s.vocab_start, num_valid=s.num_valid, group=dist.group.WORLD)
    ids, _ = localargmax.lm_head_topk(hidden, w, 16, **kw)
    t = torch.rand(5, generator=torch.Generator().manual_seed(seed)) + 0.5
    sampled = localargmax.lm_head_sample(hidden, w, temperature=t, seed=seed, offset=3, **kw)
    single = localargmax.lm_head_sample(hidden, weight, temperature=t, seed=seed, offset=3)
    # log-probabilities through the real exchange (pairs framed with the keys)
    lp = dict(return_log_probs=True, logit_scale=0.25, soft_cap=3.0)
    top = localargmax.lm_head_topk(hidden, w, 4, **kw, **lp)
    greedy = localargmax.lm_head_argmax(hidden, w, **kw, **lp)
    drawn = localargmax.lm_head_sample(hidden, w, temperature=t, seed=seed, offset=3, **kw, **lp)
    logs = [[x.tolist() for x in pair] for pair in (top, greedy, drawn)]
    return ids.tolist(), sampled.tolist(), single.tolist(), logs


def test_topk_and_sample_on_gloo_ranks(seed):
    """Real gloo ranks: top-k ids, tp-invariant samples, and the three steps'
    log-probabilities (scale and soft-cap) against float64, the same on every rank."""
    hidden, weight, _ = integer_problem(torch.Generator().manual_seed(seed), 5, 333, 11)
    logits = ref_logits(hidden, weight)
    want = ref_topk(logits, 16).tolist()
    t = torch.rand(5, generator=torch.Generator().manual_seed(seed)) + 0.5
    ref = ref_log_probs(logits, 0.25, 3.0)
    ref_t = ref_log_probs(logits, 0.25, 3.0, t)
    tol = log_prob_tolerance(hidden, weight, None, 0.25, 3.0, t, tp=3)
    results = run_ranks(_topk_sample_worker, 3, seed)
    for ids, sampled, single, logs in results:
        assert ids == want and sampled == single
        assert logs == results[0][3]
        (top_ids, top_lp), (g_ids, g_lp), (s_ids, s_lp) = (
            [torch.tensor(x, dtype=torch.float64 if i else torch.int64) for i, x in enumerate(p)] for p in logs
        )
        assert torch.equal(top_ids[:, 0], g_ids)
        cases = ((top_ids, top_lp, ref), (g_ids[:, None], g_lp[:, None], ref), (s_ids[:, None], s_lp[:, None], ref_t))
        for got_ids, got, table in cases:
            assert float((got - table.gather(1, got_ids)).abs().max()) <= tol


@settings(max_examples=1200, deadline=None)
@given(p=exact_problems(), layout=layouts(), use_d2t=st.booleans(), perm_seed=st.integers(0, 1000))
def test_sharded_argmax_exact(p, layout, use_d2t, perm_seed):
    """Exact data, random layouts and padding fills: merge_keys in any rank
    order, all-reduce MAX (sign flip) == unsigned max == all-gather + merge,
    and lm_head_argmax on every simulated rank, all equal to the reference."""
    tp, pad_to, pad = layout
    vocab = p.weight.shape[0]
    shards = make_shards(p.weight, p.bias, tp, pad_to, hidden=p.hidden, pad=pad)
    d2t = d2t_for(perm_seed, vocab) if use_d2t else None
    want = ref_argmax(p.hidden, p.weight, full_bias(p.bias, shards, vocab), d2t)
    keys = shard_keys(p.hidden, shards)
    assert torch.equal(localargmax.merge_keys(keys, d2t)[0], want), p
    perm = torch.randperm(tp, generator=torch.Generator().manual_seed(perm_seed))
    assert torch.equal(localargmax.merge_keys(keys[perm], d2t)[0], want)
    if p.hidden.shape[0]:
        assert torch.equal(allreduce_max(keys), unsigned_max(keys))
    for reduce in ("all_gather", "all_reduce"):
        assert torch.equal(simulated_argmax(p.hidden, shards, d2t=d2t, reduce=reduce), want), (p, reduce)


def test_world_size_one_without_group(gen):
    hidden = torch.randn(9, 50, generator=gen)
    weight = torch.randn(300, 50, generator=gen)
    weight[250:] = float("nan")
    reference = reference_logits_and_error(hidden, weight[:250])
    for reduce in REDUCES:  # random data: near-ties are judged with the float32 error bound
        ids = localargmax.lm_head_argmax(hidden, weight, num_valid=250, reduce=reduce)
        check_against_reference(ids, hidden, weight[:250], reference=reference, context=reduce)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(gen, backend):
    torch._dynamo.reset()
    vocab = 300
    hidden, weight = torch.randn(6, 40, generator=gen), torch.randn(320, 40, generator=gen)
    weight[vocab:] = float("nan")  # padding
    bias, d2t = torch.randn(320, generator=gen), torch.randint(0, 50, (vocab,), generator=gen)

    def step(h, w, b, d):
        return localargmax.lm_head_argmax(h, w, vocab_start=0, num_valid=vocab, bias=b, d2t=d)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    assert torch.equal(compiled(hidden, weight, bias, d2t), step(hidden, weight, bias, d2t))
    hidden2 = torch.randn(3, 40, generator=gen)  # a second batch size (recompile or dynamic shapes)
    assert torch.equal(compiled(hidden2, weight, bias, d2t), step(hidden2, weight, bias, d2t))
    plain = torch.compile(
        lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=vocab), fullgraph=True, backend=backend
    )
    assert torch.equal(plain(hidden, weight), localargmax.lm_head_argmax(hidden, weight, num_valid=vocab))


# ----------------------------------------------------------------------------- CUDA


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_step_with_d2t(gen, dtype):
    hidden, weight, _, _ = planted_problem(gen, 5, 700, 32, dtype)
    d2t = localargmax.build_d2t(torch.rand(2000, generator=gen), 700)
    ids = localargmax.lm_head_argmax(hidden.cuda(), weight.cuda(), d2t=d2t.cuda())
    assert ids.device.type == "cuda" and torch.equal(ids.cpu(), ref_argmax(hidden, weight, d2t=d2t))


@cuda_only
def test_cuda_graph_capture_and_replay_world_size_1_nccl(gen):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    for reduce in REDUCES:
        hidden, weight, _, _ = planted_problem(gen, 8, 5000, 128, torch.bfloat16)
        h, w = hidden.cuda(), weight.cuda()
        localargmax.lm_head_argmax(h, w, group=dist.group.WORLD, reduce=reduce)  # warm up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = localargmax.lm_head_argmax(h, w, group=dist.group.WORLD, reduce=reduce)
        new_hidden, new_weight, _, _ = planted_problem(gen, 8, 5000, 128, torch.bfloat16)
        h.copy_(new_hidden.cuda())
        w.copy_(new_weight.cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), ref_argmax(new_hidden, new_weight))


@cuda_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_device_guard_second_gpu(gen):
    hidden, weight, _, _ = planted_problem(gen, 4, 999, 32, torch.bfloat16)
    ids = localargmax.lm_head_argmax(hidden.to("cuda:1"), weight.to("cuda:1"))
    assert ids.device == torch.device("cuda:1") and torch.equal(ids.cpu(), ref_argmax(hidden, weight))


# ----------------------------------------------------------------------------- edge shapes at every entry point


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_empty_batch_everywhere(gen, dtype):
    """B = 0 is legal at every entry point and returns empty results."""
    h, w = torch.empty(0, 12, dtype=dtype), torch.randn(30, 12, generator=gen).to(dtype)
    keys = localargmax.shard_argmax(h, w, vocab_start=3, bias=torch.zeros(30))
    assert keys.shape == (0,) and keys.dtype == torch.int64
    assert localargmax.shard_topk(h, w, 2).shape == (0, 2)
    assert localargmax.shard_sample(h, w, torch.ones(0), 1).shape == (0,)
    for reduce in REDUCES:
        assert localargmax.lm_head_argmax(h, w, reduce=reduce).shape == (0,)
    assert localargmax.lm_head_sample(h, w, temperature=1.0, seed=1).shape == (0,)
    ids, values = localargmax.lm_head_topk(h, w, 2)
    assert ids.shape == values.shape == (0, 2)
    # merge_keys of empty keys: test_merge_keys.py::test_empty_batch
    assert localargmax.decode_keys(torch.empty(0, dtype=torch.int64))[0].shape == (0,)


def test_zero_hidden_size_is_bias_argmax(gen):
    """H = 0: every logit is the empty sum 0 plus the bias: the bias argmax, ties to the first index."""
    h, w = torch.empty(B, 0), torch.empty(ROWS, 0)
    bias = torch.tensor([0.5, 2.0, -1.0, 2.0, 0.0, 1.0])
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(h, w, vocab_start=4))
    assert ids.tolist() == [4] * B and values.tolist() == [0.0] * B
    assert localargmax.lm_head_argmax(h, w, bias=bias).tolist() == [1] * B
    assert localargmax.lm_head_argmax(h, w).tolist() == [0] * B
    assert torch.equal(localargmax.lm_head_topk(h, w, 2, bias=bias)[0], torch.tensor([[1, 3]] * B))


def test_no_valid_vocabulary_names_num_valid():
    h = torch.randn(B, H)
    for w, kwargs in ((torch.empty(0, H), {}), (torch.randn(ROWS, H), {"num_valid": 0})):
        assert localargmax.shard_argmax(h, w, **kwargs).eq(0).all()  # key 0: "no valid entry"
        raises_cleanly(ValueError, "num_valid", localargmax.lm_head_argmax, h, w, **kwargs)
        raises_cleanly(
            ValueError, "num_valid", localargmax.lm_head_sample, h, w, **dict(kwargs, temperature=1.0, seed=1)
        )
        raises_cleanly(ValueError, "exceeds the valid vocabulary", localargmax.lm_head_topk, h, w, 1, **kwargs)


def test_largest_index_accepted_everywhere():
    """The last legal index 2**32 - 2 works at every entry point (one shard on its own, on purpose)."""
    big = localargmax.MAX_GLOBAL_INDEX
    h, w = torch.rand(B, H) + 0.1, torch.zeros(ROWS, H)
    w[ROWS - 1] = 1.0
    kw = dict(vocab_start=big - ROWS + 1, group=localargmax.LOCAL_SHARD)
    assert localargmax.lm_head_argmax(h, w, **kw).tolist() == [big] * B
    assert localargmax.lm_head_topk(h, w, 1, **kw)[0].flatten().tolist() == [big] * B
    assert localargmax.lm_head_sample(h, w, temperature=0.0, seed=1, **kw).tolist() == [big] * B


@pytest.mark.parametrize("case", list(BAD_D2T))
def test_lm_head_argmax_rejects_bad_d2t(case):
    d2t, exc = BAD_D2T[case]
    hidden, weight = torch.randn(B, H), torch.randn(ROWS, H)
    weight[ROWS - 1] = hidden.sum(0) * 100  # the winning id falls outside a short table
    raises_cleanly(exc, "d2t", localargmax.lm_head_argmax, hidden, weight, d2t=d2t)


# ------------------------------------------ d2t coverage and a corrupt exchange (checked from the step header)


@pytest.mark.parametrize("off", [-3, -1, 1, 5])
@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_d2t_of_another_length_refused_on_every_call(gen, op, off):
    """A d2t shorter or longer than the draft vocabulary is refused whichever
    id wins, a winner among the covered rows included: the one rule of
    validate_d2t (DESIGN.md, "The d2t rule"); the module and the mixin too."""
    vocab, hsize = 40, 8
    d2t = torch.zeros(vocab + off, dtype=torch.int64)
    match = rf"d2t has {vocab + off} entries .* draft vocabulary of the TP ranks has {vocab} ids"
    with pytest.raises(ValueError, match=r"d2t must be 1-D \[draft_vocab_size=40\]"):
        localargmax.validate_d2t(d2t, vocab, 2 * vocab)
    for winner in (0, vocab // 2, vocab - 1):
        hidden, weight = _planted(gen, vocab, hsize, winner)
        call = {
            "argmax": lambda: localargmax.lm_head_argmax(hidden, weight, d2t=d2t),
            "topk": lambda: localargmax.lm_head_topk(hidden, weight, 2, d2t=d2t),
            "sample": lambda: localargmax.lm_head_sample(hidden, weight, temperature=0.5, seed=1, d2t=d2t),
        }[op]
        with pytest.raises(ValueError, match=match):
            call()
    head = localargmax.VocabParallelLMHead.from_full(weight, 0, 1)
    with pytest.raises(ValueError, match=match):
        head(hidden, d2t)

    class Draft(torch.nn.Module, localargmax.LocalArgmaxMixin):
        def __init__(self):
            super().__init__()
            self.lm_head, self.draft_id_to_target_id = head, d2t

    with pytest.raises(ValueError, match=match):
        Draft().get_top_tokens(hidden)
    # a table of the vocabulary's length works, and maps
    hidden, weight = _planted(gen, vocab, hsize, 5)
    full = torch.arange(vocab, dtype=torch.int64) * 2
    assert localargmax.lm_head_argmax(hidden, weight, d2t=full).tolist() == [5 + 10]


def _planted(gen, vocab, hsize, winner):
    """hidden [1, H] and weight [V, H] whose float64 argmax is ``winner``
    (rows of norm <= 1, the winner's logit twice any other's bound)."""
    hidden = torch.randn(1, hsize, generator=gen)
    weight = torch.randn(vocab, hsize, generator=gen)
    weight = weight / weight.norm(dim=1, keepdim=True)
    weight[winner] = 2 * hidden[0] / hidden.norm()
    assert reference_argmax(hidden, weight).tolist() == [winner]
    return hidden, weight


def test_short_d2t_refused_across_simulated_ranks(gen):
    """tp = 2: the table covers rank 0's ids but not all of rank 1's. Both
    ranks refuse (the verdict comes from the exchanged headers, so neither is
    left waiting), even when the winner sits on rank 0."""
    rows, hsize = 16, 4
    hidden, weight = _planted(gen, 2 * rows, hsize, 2)
    d2t = torch.zeros(2 * rows - 1, dtype=torch.int64)
    keys = [localargmax.shard_argmax(hidden, weight[r * rows : (r + 1) * rows], vocab_start=r * rows) for r in range(2)]
    frames = stack_frames(keys, [(0, rows), (rows, rows)])
    for r in range(2):
        with pytest.raises(ValueError, match="d2t has 31 entries"):
            localargmax.lm_head_argmax(
                hidden, weight[r * rows : (r + 1) * rows], vocab_start=r * rows, d2t=d2t, group=lambda x: frames
            )


def test_corrupt_exchange_never_returns_an_out_of_vocabulary_id(gen):
    """Received keys that decode outside [0, vocab_total) or headers that do
    not match this rank's size: ValueError, never an id."""
    rows, hsize = 8, 4
    weight = torch.randn(rows, hsize, generator=gen)
    hidden = torch.randn(3, hsize, generator=gen)
    mine = localargmax.shard_argmax(hidden, weight)
    other = localargmax.shard_argmax(hidden, weight, vocab_start=rows)
    garbage = other.clone()
    garbage[1] = (garbage[1] & ~0xFFFFFFFF) | 0  # low half 0: decodes to id 4294967295
    frames = stack_frames([mine, garbage], [(0, rows), (rows, rows)])
    with pytest.raises(ValueError, match="decodes to vocabulary id 4294967295, outside the valid vocabulary"):
        localargmax.lm_head_argmax(hidden, weight, group=lambda x: frames)
    # rank 1 sent 2 keys and the transport padded its buffer with a stray key: misaligned headers
    from localargmax.collective import frame_keys

    misaligned = torch.stack([frame_keys(mine, rows), torch.cat([frame_keys(other[:2], 2 * rows), other[2:]])])
    with pytest.raises(ValueError, match="disagree on the size of this step's key exchange"):
        localargmax.lm_head_argmax(hidden, weight, group=lambda x: misaligned)
    for sizes in ([3, 2], [3, 4]):
        fake = stack_frames([mine, mine], [(0, rows), (rows, rows)])
        fake[1, 0] = sizes[1] + 1  # rank 1's header (words 0:3) claims another batch size
        fake[1, 1] = -(sizes[1] + 1)
        with pytest.raises(ValueError, match=rf"this rank sent 3 keys .* the ranks sent \[3, {sizes[1]}\]"):
            localargmax.lm_head_argmax(hidden, weight, group=lambda x: fake)


# ----------------------------------------------------------------------------- ranks that disagree on the batch


def _worker_batch_mismatch(rank, world, op, reduce, debug):
    """Rank 0 calls with batch 3, rank 1 with batch 2."""
    import os

    import torch.distributed as dist

    if debug:
        os.environ["LOCALARGMAX_DEBUG"] = "1"
    torch.manual_seed(100 + rank)
    hidden = torch.randn(3 if rank == 0 else 2, 4)
    weight = torch.randn(8, 4)
    kw = dict(vocab_start=8 * rank, group=dist.group.WORLD)
    dist.barrier()
    if op == "argmax":
        return timed(lambda: localargmax.lm_head_argmax(hidden, weight, reduce=reduce, **kw))
    if op == "topk":
        return timed(lambda: localargmax.lm_head_topk(hidden, weight, 2, **kw)[0])
    return timed(lambda: localargmax.lm_head_sample(hidden, weight, temperature=1.0, seed=0, reduce=reduce, **kw))


CASES = [
    (op, r) for op in ("argmax", "topk", "sample") for r in REDUCES if (op, r) != ("topk", "all_reduce")
]  # top-k gathers


@pytest.mark.parametrize("op,reduce", CASES)
def test_batch_mismatch_with_debug_raises_on_every_rank(op, reduce):
    result = launch(_worker_batch_mismatch, 2, op, reduce, True, pg_timeout=30.0, wall_timeout=120.0)
    for r, o in enumerate(result.ranks):
        assert o.status == "ok", f"rank {r}: {o.status} {o.value}"
        assert not o.value["ok"] and o.value["type"] == "ValueError", o.value
        assert "ranks disagree on batch size" in o.value["error"] and "ranks [0]: 3" in o.value["error"]
    assert not live_descendants(result.pids)


@pytest.mark.parametrize("op,reduce", CASES)
def test_batch_mismatch_without_debug_never_returns_ids(op, reduce):
    """Without LOCALARGMAX_DEBUG: a rank may die inside gloo (SIGABRT) or raise
    (the collective's error, or the step's "disagree on the size" check), but
    no rank returns ids (such as [3, 4294967295, 0], an id outside the vocabulary)."""
    result = launch(_worker_batch_mismatch, 2, op, reduce, False, pg_timeout=5.0, wall_timeout=120.0)
    for r, o in enumerate(result.ranks):
        print(f"{op}/{reduce} rank {r}: {o.status} exit={o.exitcode} {str(o.value)[:200]}")
        assert o.status != "hung", o.value
        if o.status == "ok":
            assert not o.value["ok"], f"rank {r} returned ids {o.value.get('value')} for a mismatched batch"
    assert not live_descendants(result.pids)
