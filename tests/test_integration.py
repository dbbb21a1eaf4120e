"""Draft-model integration: VocabParallelLMHead, LocalArgmaxMixin (our module
and the vLLM duck-typed layout), load-time checks, communicators,
torch.compile, and the real drafting loop of examples/greedy_drafting.py."""
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import localargmax
from helpers import run_ranks, stack_frames
from localargmax.reference import reference_argmax

ROOT = Path(__file__).resolve().parent.parent


def _problem(gen, batch, vocab, hsize, dtype=torch.float32):
    """Random hidden/weight whose float64 top-1 wins by a clear margin."""
    weight = torch.randn(vocab, hsize, generator=gen).to(dtype)
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    winners = torch.randint(0, vocab, (batch,), generator=gen)
    weight[winners] = (hidden.float() * 4).to(dtype)  # clear winners (a later duplicate never wins a tie)
    return hidden, weight


class Draft(localargmax.LocalArgmaxMixin, nn.Module):
    def __init__(self, lm_head, d2t=None, **attrs):
        super().__init__()
        self.lm_head = lm_head
        self.draft_id_to_target_id = d2t
        for k, v in attrs.items():
            setattr(self, k, v)

    def forward(self, hidden):
        return self.get_top_tokens(torch.tanh(hidden) * 3)


def _vllm_head(full_weight, rank, tp, pad_to=64):
    """A stand-in for vLLM's ParallelLMHead: weight [rows, H] and shard_indices."""
    start, rows, valid = localargmax.shard_vocab(full_weight.shape[0], rank, tp, pad_to)
    weight = torch.zeros(rows, full_weight.shape[1], dtype=full_weight.dtype)
    weight[:valid] = full_weight[start:start + valid]
    idx = types.SimpleNamespace(org_vocab_start_index=start, org_vocab_end_index=start + valid,
                                num_org_vocab_padding=rows - valid)
    return types.SimpleNamespace(weight=weight, shard_indices=idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_lm_head_module_world_size_1(gen, dtype, with_bias):
    hidden, weight = _problem(gen, 5, 333, 40, dtype)
    bias = torch.randn(333, generator=gen).to(dtype) * 0.01 if with_bias else None
    head = localargmax.VocabParallelLMHead.from_full(weight, 0, 1, bias=bias)
    assert head.weight.shape == (384, 40) and head.num_valid == 333
    assert torch.equal(head(hidden), reference_argmax(hidden, weight, bias))
    logits = head.local_logits(hidden)
    assert logits.shape == (5, 384) and torch.isneginf(logits[:, 333:]).all()


def test_mixin_our_module_and_vllm_layout_agree(gen):
    hidden, weight = _problem(gen, 6, 1000, 32)
    d2t = localargmax.build_d2t(torch.rand(3000, generator=gen), 1000)
    want = reference_argmax(torch.tanh(hidden) * 3, weight, d2t=d2t)
    ours = Draft(localargmax.VocabParallelLMHead.from_full(weight, 0, 1), d2t)
    vllm = Draft(_vllm_head(weight, 0, 1), d2t)
    assert torch.equal(ours(hidden), want)
    assert torch.equal(vllm(hidden), want)


def test_mixin_scale_and_softcap(gen):
    hidden, weight = _problem(gen, 4, 500, 16)
    head = localargmax.VocabParallelLMHead.from_full(weight, 0, 1)
    processor = types.SimpleNamespace(scale=0.5, soft_cap=30.0)
    want = reference_argmax(torch.tanh(hidden) * 3, weight)
    assert torch.equal(Draft(head, logits_processor=processor)(hidden), want)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="logit scale must be > 0"):
            Draft(head, logit_scale=bad)(hidden)
        with pytest.raises(ValueError, match="logit scale must be > 0"):
            Draft(head, logits_processor=types.SimpleNamespace(scale=bad))(hidden)


def test_mixin_names_missing_attributes(gen):
    hidden, weight = _problem(gen, 2, 100, 8)

    class NoHead(localargmax.LocalArgmaxMixin, nn.Module):
        pass

    with pytest.raises(AttributeError, match="no attribute 'lm_head'"):
        NoHead().get_top_tokens(hidden)
    with pytest.raises(AttributeError, match="'shard_indices'"):
        Draft(types.SimpleNamespace(weight=weight))(hidden)
    partial = types.SimpleNamespace(weight=weight, shard_indices=types.SimpleNamespace(org_vocab_start_index=0))
    with pytest.raises(AttributeError, match="org_vocab_end_index"):
        Draft(partial)(hidden)


def test_compile_fullgraph_world_size_1(gen):
    hidden, weight = _problem(gen, 3, 700, 24)
    model = Draft(localargmax.VocabParallelLMHead.from_full(weight, 0, 1))
    eager = model(hidden)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)(hidden)
    assert torch.equal(compiled, eager) and torch.equal(eager, reference_argmax(torch.tanh(hidden) * 3, weight))


def test_callable_group_is_an_all_gather(gen):
    hidden, weight = _problem(gen, 5, 900, 16)
    want = reference_argmax(hidden, weight)
    shards = [localargmax.VocabParallelLMHead.from_full(weight, r, 3) for r in range(3)]
    keys = stack_frames([localargmax.shard_argmax(hidden, h.weight, vocab_start=h.vocab_start, num_valid=h.num_valid)
                         for h in shards], [(h.vocab_start, h.num_valid) for h in shards])
    for r, h in enumerate(shards):  # each "rank" sees the others' keys through the engine's gather
        ids = localargmax.lm_head_argmax(hidden, h.weight, vocab_start=h.vocab_start, num_valid=h.num_valid,
                                         group=lambda k: keys)
        assert torch.equal(ids, want)
    with pytest.raises(ValueError, match=r"must return \[tp, 8\], an all-gather"):
        localargmax.lm_head_argmax(hidden, weight, group=lambda k: k)
    with pytest.raises(ValueError, match="reduce='all_gather'"):
        localargmax.lm_head_argmax(hidden, weight, group=lambda k: keys, reduce="all_reduce")


class _FakeNcclComm:
    """Mimics cupy.cuda.nccl.NcclCommunicator's pointer API."""

    def size(self):
        return 1

    def rank_id(self):
        return 0

    def allGather(self, *a):  # noqa: N802
        raise AssertionError("not reached")

    def allReduce(self, *a):  # noqa: N802
        raise AssertionError("not reached")


def test_cupy_communicator_without_cupy_is_a_clear_error(gen, monkeypatch):
    hidden, weight = _problem(gen, 2, 100, 8)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(ImportError, match=r"localargmax\[cupy\]"):
        localargmax.lm_head_argmax(hidden, weight, group=_FakeNcclComm())


def test_bad_group_type(gen):
    hidden, weight = _problem(gen, 2, 100, 8)
    with pytest.raises(TypeError, match="group must be None, a torch.distributed.ProcessGroup"):
        localargmax.lm_head_argmax(hidden, weight, group=42)


def test_validate_d2t_and_build_d2t(gen):
    counts = torch.randint(0, 50, (300,), generator=gen)
    d2t = localargmax.build_d2t(counts, 64)
    localargmax.validate_d2t(d2t, 64, 300)
    target = localargmax.draft_to_target_ids(d2t)
    assert (target[1:] > target[:-1]).all()
    assert counts[target].min() >= counts[torch.tensor(sorted(set(range(300)) - set(target.tolist())))].max()
    with pytest.raises(TypeError, match="int64"):
        localargmax.validate_d2t(d2t.int(), 64, 300)
    with pytest.raises(ValueError, match="draft_vocab_size=65"):
        localargmax.validate_d2t(d2t, 65, 300)
    bad = d2t.clone()
    bad[7] = 10_000
    with pytest.raises(ValueError, match="draft id 7"):
        localargmax.validate_d2t(bad, 64, 300)


# ---------------------------------------------------------------- multi-rank


def _compile_worker(rank, world_size, seed):
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(seed)
    hidden, weight = _problem(gen, 5, 1001, 24)
    d2t = localargmax.build_d2t(torch.rand(2500, generator=gen), 1001)
    head = localargmax.VocabParallelLMHead.from_full(weight, rank, world_size, group=dist.group.WORLD)
    model = Draft(head, d2t)
    eager = model(hidden)
    compiled = torch.compile(model, fullgraph=True)(hidden)
    vllm = Draft(_vllm_head(weight, rank, world_size), d2t, local_argmax_group=dist.group.WORLD)(hidden)
    want = reference_argmax(torch.tanh(hidden) * 3, weight, d2t=d2t)
    return eager.tolist(), compiled.tolist(), vllm.tolist(), want.tolist()


def test_compile_fullgraph_with_gloo_group_of_2(seed):
    for eager, compiled, vllm, want in run_ranks(_compile_worker, 2, seed):
        assert eager == want and compiled == want and vllm == want


def _bad_layout_worker(rank, world_size):
    import torch.distributed as dist

    weight = torch.randn(1000, 8)
    # rank 1 believes the TP size is 3: its rows and vocab_start disagree with rank 0's
    tp_seen = world_size if rank == 0 else 3
    try:
        localargmax.VocabParallelLMHead.from_full(weight, rank, tp_seen, group=dist.group.WORLD)
    except ValueError as e:
        return str(e)
    return None


def test_inconsistent_layouts_fail_on_every_rank_naming_the_ranks():
    messages = run_ranks(_bad_layout_worker, 2, timeout=120)
    for m in messages:
        assert m is not None and "inconsistent vocab-parallel layouts" in m
        assert "rows differs across ranks" in m and "ranks [0]" in m and "ranks [1]" in m


def test_greedy_drafting_example_identical_to_unsharded():
    """The README's example: Qwen3 draft, TP=2 gloo, 32 steps, with and without d2t."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "greedy_drafting.py"), "--steps", "32"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("identical to unsharded: yes") == 2, proc.stdout[-3000:]
    assert proc.stdout.count("step 31:") == 2
