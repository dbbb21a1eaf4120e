"""Field faults of rounds 2 and 3 (issues #12, #18), each with its right value
and the whole kind around it: sampling temperature edges, d2t tables that do
not cover the vocabulary, a float32 bias through the module, logit scales
written behind the check's back, and ranks that disagree on the batch."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from localargmax.reference import reference_argmax
from tests.support.launch import launch, live_descendants, timed
from tests.support.problems import stack_frames

TINY_TEMPERATURES = (1e-30, 1e-37, 1e-38, 1e-40, 1e-45)


# ----------------------------------------------------------------------------- sampling temperature


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_tiny_temperature_gives_the_greedy_id(temperature):
    """The issue's inputs: logits [10, 20] and [-20, -10] (and their mirrors)
    at a temperature so small that logit / T overflows float32."""
    hidden = torch.tensor([[1.0]])
    for logits, want in (
        ([10.0, 20.0], 1),
        ([-20.0, -10.0], 1),
        ([20.0, 10.0], 0),
        ([-10.0, -20.0], 0),
        ([-5.0, 3.0], 1),
        ([3.0, -5.0], 0),
    ):
        weight = torch.tensor(logits).view(2, 1)
        for seed in range(4):
            ids = localargmax.lm_head_sample(hidden, weight, temperature=temperature, seed=seed)
            assert ids.tolist() == [want], (logits, temperature, seed)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES + (1e-3,))
def test_tiny_temperature_random_logits_every_layout(gen, temperature):
    """Random rows whose logits are all positive, all negative or mixed (a
    per-row shift of +50 / -50 / 0 through an extra hidden column), with a
    clear top-1: every tiny T samples the float64 greedy id, as a float or a
    tensor temperature, on one rank and on simulated tp = 3 with an uneven
    last shard (the same score formula on every rank)."""
    batch, vocab, hsize = 24, 301, 16
    hidden = torch.cat(
        [torch.randn(batch, hsize, generator=gen), torch.tensor([50.0, -50.0, 0.0]).repeat(8)[:, None]], 1
    )
    weight = torch.cat([torch.randn(vocab, hsize, generator=gen), torch.ones(vocab, 1)], 1)
    top2 = (hidden.double() @ weight.double().T).topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 0.05  # far above T * |g| <= 1e-3 * 23
    greedy = reference_argmax(hidden, weight)
    ids = localargmax.lm_head_sample(hidden, weight, temperature=temperature, seed=3)
    assert torch.equal(
        ids, localargmax.lm_head_sample(hidden, weight, temperature=torch.full((batch,), temperature), seed=3)
    )
    assert keep.sum() > 15 and torch.equal(ids[keep], greedy[keep])
    rows = 128
    shards = []
    for r in range(3):
        w = torch.zeros(rows, hsize + 1)
        valid = max(0, min(rows, vocab - r * rows))
        w[:valid] = weight[r * rows : r * rows + valid]
        shards.append((w, r * rows, valid))
    t = torch.full((batch,), temperature)
    frames = stack_frames(
        [localargmax.shard_sample(hidden, w, t, 3, 0, vocab_start=s, num_valid=n) for w, s, n in shards],
        [(s, n) for _, s, n in shards],
    )
    for w, s, n in shards:
        got = localargmax.lm_head_sample(
            hidden, w, temperature=temperature, seed=3, vocab_start=s, num_valid=n, group=lambda x: frames
        )
        assert torch.equal(got, ids)


@pytest.mark.parametrize("temperature", [1e-45, 1e-3, 0.999, 1.0, 1e3, 1e30, 3e38])
def test_banned_token_never_sampled(temperature):
    """-inf logits (banned tokens) are never drawn at any accepted temperature,
    including huge finite ones where T * g or s / T could overflow."""
    vocab = 16
    weight = torch.ones(vocab, 1)
    bias = torch.zeros(vocab)
    banned = torch.tensor([0, 3, 7, 15])
    bias[banned] = -math.inf
    hidden = torch.ones(64, 1)
    for seed in range(8):
        ids = localargmax.lm_head_sample(
            hidden, weight, bias=bias, temperature=temperature, seed=seed, offset=64 * seed
        )
        assert not torch.isin(ids, banned).any(), (temperature, seed, ids.tolist())
        assert ((ids >= 0) & (ids < vocab)).all()


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1.0, -1e-45])
def test_non_finite_or_negative_temperature_refused(bad):
    """T = +inf would turn a banned -inf logit into NaN (and NaN wins): refused,
    as a Python number, a float32 tensor (read by the CPU kernel), a 0-d
    tensor, a float64 tensor, and through shard_sample directly."""
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[1.0], [2.0]])
    bias = torch.tensor([-math.inf, 0.0])
    for t in (bad, torch.tensor([bad]), torch.tensor(bad), torch.tensor([bad], dtype=torch.float64)):
        with pytest.raises(ValueError, match="temperature must be"):
            localargmax.lm_head_sample(hidden, weight, bias=bias, temperature=t, seed=0)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        localargmax.shard_sample(hidden, weight, torch.tensor([bad], dtype=torch.float32), 0, bias=bias)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        torch.ops.localargmax.shard_sample.default(hidden, weight, bias, 0, 2, torch.tensor([bad]), 0, 0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_compiled_sample_refuses_like_eager(bad):
    """torch.compile(fullgraph=True) must not give a bad temperature another
    meaning: the CPU kernel reads the values, so compiled raises too."""
    torch._dynamo.reset()
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[10.0], [20.0]])
    step = torch.compile(lambda h, w, t: localargmax.lm_head_sample(h, w, temperature=t, seed=0), fullgraph=True)
    assert step(hidden, weight, torch.tensor([1e-38])).tolist() == [1]  # and the tiny-T answer compiled
    with pytest.raises((ValueError, RuntimeError), match="temperature must be finite and >= 0"):
        step(hidden, weight, torch.tensor([bad]))


# ----------------------------------------------------------------------------- d2t coverage


@pytest.mark.parametrize("short", [1, 3])
@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_short_d2t_refused_on_every_call(gen, op, short):
    """A d2t shorter than the draft vocabulary is refused whichever id wins
    (it used to fail only when the winner was among the uncovered rows)."""
    vocab, hsize = 40, 8
    d2t = torch.zeros(vocab - short, dtype=torch.int64)
    for winner in (0, vocab // 2, vocab - 1):
        hidden, weight = _planted(gen, vocab, hsize, winner)
        call = {
            "argmax": lambda: localargmax.lm_head_argmax(hidden, weight, d2t=d2t),
            "topk": lambda: localargmax.lm_head_topk(hidden, weight, 2, d2t=d2t),
            "sample": lambda: localargmax.lm_head_sample(hidden, weight, temperature=0.5, seed=1, d2t=d2t),
        }[op]
        with pytest.raises(ValueError, match=rf"d2t has {vocab - short} entries .* spans ids \[0, {vocab}\)"):
            call()
    # a table that covers the vocabulary still works, and maps
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
        fake[1, 3] = sizes[1] + 1  # rank 1's header claims another batch size
        fake[1, 4] = -(sizes[1] + 1)
        with pytest.raises(ValueError, match=rf"this rank sent 3 keys .* the ranks sent \[3, {sizes[1]}\]"):
            localargmax.lm_head_argmax(hidden, weight, group=lambda x: fake)


# ----------------------------------------------------------------------------- module and mixin conversions


def test_module_keeps_a_float32_bias_exact():
    """The issue's input: an fp32 bias on a bf16 head through the module gives
    the op's answer (the bias is held in float32, never rounded to bf16)."""
    weight = torch.ones(3, 2, dtype=torch.bfloat16)
    hidden = torch.ones(1, 2, dtype=torch.bfloat16)
    bias = torch.tensor([1.0, 1.0 + 2**-11, 1.0])
    assert localargmax.lm_head_argmax(hidden, weight, bias=bias).tolist() == [1]
    for tp in (1, 2, 3):
        heads = [localargmax.VocabParallelLMHead.from_full(weight, r, tp, bias=bias, pad_to=1) for r in range(tp)]
        assert all(h.bias.dtype == torch.float32 for h in heads)
        frames = stack_frames(
            [
                localargmax.shard_argmax(
                    hidden, h.weight, vocab_start=h.vocab_start, num_valid=h.num_valid, bias=h.bias
                )
                for h in heads
            ],
            [(h.vocab_start, h.num_valid) for h in heads],
        )
        for h in heads:
            h.group = lambda x: frames
            assert h(hidden).tolist() == [1], f"tp={tp}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_module_bias_every_dtype_matches_the_op(gen, dtype):
    """Random bias near-ties that the weight dtype cannot hold: module == op ==
    float64 reference; a bias in the weight dtype is kept exactly too; a
    float64 bias is refused like the op refuses it."""
    vocab, hsize = 50, 8
    weight = torch.randn(vocab, hsize, generator=gen).to(dtype)
    hidden = torch.randn(6, hsize, generator=gen).to(dtype)
    logits = hidden.double() @ weight.double().T
    bias = (-logits.max(dim=0).values).float()  # flatten the logits so the bias decides
    bias += torch.rand(vocab, generator=gen) * 2**-12
    for b in (bias, bias.to(dtype)):
        head = localargmax.VocabParallelLMHead.from_full(weight, 0, 1, bias=b)
        want = localargmax.lm_head_argmax(hidden, weight, bias=b)
        assert torch.equal(head(hidden), want)
        assert torch.equal(want, reference_argmax(hidden.float(), weight.float(), b.float()))
    with pytest.raises(TypeError, match="bias dtype must be float32 or the weight dtype"):
        localargmax.VocabParallelLMHead.from_full(weight, 0, 1, bias=bias.double())


class _Draft(torch.nn.Module, localargmax.LocalArgmaxMixin):
    def __init__(self, scale):
        super().__init__()
        self.lm_head = localargmax.VocabParallelLMHead.from_full(torch.eye(3), 0, 1)
        self.logit_scale = scale


@pytest.mark.parametrize("write", ["data_copy", "data_assign", "copy", "fill", "param_replace", "python_float"])
@pytest.mark.parametrize("bad", [-1.0, 0.0, math.nan])
def test_logit_scale_checked_however_written(write, bad):
    """A scale written after a first, good call (as weight reloads do) is
    checked again: every way of writing it."""
    hidden = torch.tensor([[1.0, 0.5, 0.0]])
    good = 1.0 if write == "python_float" else torch.nn.Parameter(torch.tensor(1.0), requires_grad=False)
    model = _Draft(good)
    assert model.get_top_tokens(hidden).tolist() == [0]
    with torch.no_grad():
        if write == "data_copy":
            model.logit_scale.data.copy_(torch.tensor(bad))
        elif write == "data_assign":
            model.logit_scale.data = torch.tensor(bad)
        elif write == "copy":
            model.logit_scale.copy_(torch.tensor(bad))
        elif write == "fill":
            model.logit_scale.fill_(bad)
        elif write == "param_replace":
            model.logit_scale = torch.nn.Parameter(torch.tensor(bad), requires_grad=False)
        else:
            model.logit_scale = bad
    with pytest.raises(ValueError, match="logit scale must be > 0"):
        model.get_top_tokens(hidden)


def test_logit_scale_checked_under_compile():
    """Under torch.compile the CPU scale is checked by a device-side assert
    (raises RuntimeError) instead of being skipped."""
    torch._dynamo.reset()
    model = _Draft(torch.nn.Parameter(torch.tensor(1.0), requires_grad=False))
    hidden = torch.tensor([[1.0, 0.5, 0.0]])
    step = torch.compile(model.get_top_tokens, fullgraph=True)
    assert step(hidden).tolist() == [0]
    model.logit_scale.data.fill_(-1.0)
    with pytest.raises(RuntimeError, match="logit scale must be > 0"):
        step(hidden)


# ----------------------------------------------------------------------------- ranks that disagree on the batch


def _worker_batch_mismatch(rank, world, op, reduce, debug):
    """Rank 0 calls with batch 3, rank 1 with batch 2 (the issue's input)."""
    import os

    import torch.distributed as dist

    if debug:
        os.environ["LOCALARGMAX_DEBUG"] = "1"
        localargmax.envs.reload()
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
    ("argmax", "all_gather"),
    ("argmax", "all_reduce"),
    ("topk", "all_gather"),
    ("sample", "all_gather"),
    ("sample", "all_reduce"),
]


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
    no rank returns ids (the issue saw [3, 4294967295, 0] from sampling)."""
    result = launch(_worker_batch_mismatch, 2, op, reduce, False, pg_timeout=5.0, wall_timeout=120.0)
    for r, o in enumerate(result.ranks):
        print(f"{op}/{reduce} rank {r}: {o.status} exit={o.exitcode} {str(o.value)[:200]}")
        assert o.status != "hung", o.value
        if o.status == "ok":
            assert not o.value["ok"], f"rank {r} returned ids {o.value.get('value')} for a mismatched batch"
    assert not live_descendants(result.pids)


# ----------------------------------------------------------------------------- the path keyword (issue #13)


@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_cpu_path_keyword(gen, op):
    """CPU paths: generic and avx2 (where the CPU has it) give bit-identical
    keys; an unknown path, or a CUDA path on CPU, is a ValueError naming
    ``path`` (checked by the wrapper and by the kernel itself)."""
    hidden = torch.randn(5, 37, generator=gen).to(torch.bfloat16)
    weight = torch.randn(200, 37, generator=gen).to(torch.bfloat16)
    call = {
        "argmax": lambda p: localargmax.shard_argmax(hidden, weight, path=p),
        "topk": lambda p: localargmax.shard_topk(hidden, weight, 3, path=p),
        "sample": lambda p: localargmax.shard_sample(hidden, weight, torch.full((5,), 0.7), 9, path=p),
    }[op]
    auto, generic = call("auto"), call("generic")
    assert torch.equal(auto, generic)
    try:
        avx2 = call("avx2")
    except ValueError as e:  # a CPU without AVX2: the refusal must say why
        assert "needs a CPU with AVX2" in str(e)
    else:
        assert torch.equal(avx2, generic)
    for bad in ("mma", "simt", "AVX2", "", None, 3):
        with pytest.raises(ValueError, match="path must be one of"):
            call(bad)
    with pytest.raises(ValueError, match="path must be 'auto', 'generic' or 'avx2' on CPU"):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 200, "gemm")


def test_envs_registry_reads_once_and_parses(monkeypatch):
    """Every LOCALARGMAX_* knob is in localargmax.envs with a default and a
    meaning; values are read once (until reload) and a bad value names the
    variable."""
    from localargmax import envs

    assert all(k.startswith("LOCALARGMAX_") and knob.meaning for k, knob in envs.KNOBS.items())
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "1")
    envs.reload()
    assert envs.LOCALARGMAX_DEBUG is True
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "0")
    assert envs.LOCALARGMAX_DEBUG is True  # cached
    envs.reload()
    assert envs.LOCALARGMAX_DEBUG is False
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "maybe")
    envs.reload()
    with pytest.raises(ValueError, match="LOCALARGMAX_DEBUG='maybe'"):
        _ = envs.LOCALARGMAX_DEBUG
    monkeypatch.delenv("LOCALARGMAX_DEBUG")
    envs.reload()
    with pytest.raises(AttributeError):
        _ = envs.LOCALARGMAX_NOT_A_KNOB
