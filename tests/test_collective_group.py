"""What a step's group must be (collective.check_group: a missing TP group
is refused; LOCAL_SHARD asks for one shard's own answer) and the engine-callable contract (payload_length: what a
callable group is handed and returns)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import localargmax
from tests.support.problems import (
    make_shards,
)
from tests.support.reference import check_against_reference

# ----------------------------------------------------------------------------- a missing TP group (check_group)

STEPS = {
    "argmax": lambda h, w, **kw: localargmax.lm_head_argmax(h, w, **kw),
    "argmax_log_probs": lambda h, w, **kw: localargmax.lm_head_argmax(h, w, return_log_probs=True, **kw),
    "topk": lambda h, w, **kw: localargmax.lm_head_topk(h, w, 2, **kw),
    "sample": lambda h, w, **kw: localargmax.lm_head_sample(h, w, temperature=1.0, seed=3, **kw),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_step_with_no_group_past_vocab_start_zero_raises(step):
    """``group=dist.group.WORLD`` before init_process_group is None: rank 1's
    shard of a 32000-id vocabulary (vocab_start=16000) would return its own
    winners. ValueError naming init_process_group and LOCAL_SHARD, on every
    call; vocab_start == 0 (world size 1) runs."""
    assert dist.group.WORLD is None
    hidden, full = torch.randn(4, 8), torch.randn(32000, 8)
    _, _, shard = make_shards(full, None, 2, 64)[1]
    assert shard.vocab_start == 16000
    for _ in range(2):  # not a once-per-process warning
        with pytest.raises(ValueError, match=r"vocab_start=16000.*init_process_group.*localargmax\.LOCAL_SHARD"):
            STEPS[step](hidden, full[16000:], vocab_start=16000, group=dist.group.WORLD)
    STEPS[step](hidden, full[:16000], group=dist.group.WORLD)


def test_step_with_a_group_of_one_rank_past_vocab_start_zero_raises():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for step in STEPS.values():
            with pytest.raises(ValueError, match="a group of one rank but vocab_start=50.*init_process_group"):
                step(torch.randn(2, 8), torch.randn(50, 8), vocab_start=50, group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("step", list(STEPS))
def test_local_shard_returns_the_shards_own_answer(step, gen):
    """``group=localargmax.LOCAL_SHARD``: no exchange, the shard's own answer
    (the same as a callable group that gathers this rank alone), eager and
    under torch.compile; the argmax is float64's over the shard's valid ids,
    padding that would win never does."""
    full = torch.randn(300, 16, generator=gen)
    hidden = torch.randn(5, 16, generator=gen)
    weight, _, shard = make_shards(full, None, 2, 64, hidden=hidden)[1]
    kw = dict(vocab_start=shard.vocab_start, num_valid=shard.num_valid)
    got = STEPS[step](hidden, weight, group=localargmax.LOCAL_SHARD, **kw)
    alone = STEPS[step](hidden, weight, group=lambda x: x[None], **kw)
    compiled = torch.compile(
        lambda h: STEPS[step](h, weight, group=localargmax.LOCAL_SHARD, **kw), fullgraph=True, backend="eager"
    )
    for other in (alone, compiled(hidden)):
        for g, w in zip(got if isinstance(got, tuple) else (got,), other if isinstance(other, tuple) else (other,)):
            assert torch.equal(g, w) or torch.allclose(g, w, equal_nan=True, atol=1e-6), (step, g, w)
    if step.startswith("argmax"):
        ids = got[0] if isinstance(got, tuple) else got
        own = full[shard.vocab_start : shard.vocab_start + shard.num_valid]
        check_against_reference(ids - shard.vocab_start, hidden, own)
    assert torch.equal(localargmax.exchange_keys(torch.arange(3), localargmax.LOCAL_SHARD), torch.arange(3)[None])
    assert repr(localargmax.LOCAL_SHARD) == "localargmax.LOCAL_SHARD"


def test_check_group_refuses_a_tp_layout_without_a_group():
    with pytest.raises(ValueError, match=r"TP rank 1 of world_size 2.*init_process_group"):
        localargmax.collective.check_group(None, world_size=2, rank=1)
    localargmax.collective.check_group(None, world_size=1, rank=0)  # world size 1: None is right
    localargmax.collective.check_group(lambda k: k[None], world_size=2, rank=1)  # a callable: size unseen
    localargmax.collective.check_group(localargmax.LOCAL_SHARD, world_size=2, rank=1)  # one shard, on purpose
    localargmax.collective.check_group(localargmax.LOCAL_SHARD, vocab_start=64)


# ----------------------------------------------------------------------------- the engine-callable contract


@pytest.mark.parametrize("tp", [1, 3])
@pytest.mark.parametrize("log_probs", [False, True])
@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_callable_group_preallocated_from_payload_length(gen, op, log_probs, tp):
    """An engine preallocates its gather buffer ``[tp, payload_length(B, k,
    log_probs)]`` (as for a CUDA graph) and copies what it is handed into it:
    every step hands exactly that length, and the ids are float64's."""
    vocab, hsize, k = 3 * 64, 8, 4
    full = torch.randn(vocab, hsize, generator=gen)
    shards = make_shards(full, None, tp, 64)
    for batch in (0, 1, 5):
        hidden = torch.randn(batch, hsize, generator=gen)
        length = localargmax.payload_length(batch, k if op == "topk" else 1, log_probs)
        buffer = torch.empty(tp, length, dtype=torch.int64)
        handed = []
        frames = {}
        for r, (w, _, shard) in enumerate(shards):
            kw = dict(vocab_start=shard.vocab_start, num_valid=shard.num_valid, return_log_probs=log_probs)

            def capture(x, r=r):
                handed.append(x.shape)
                frames[r] = x.clone()
                return x[None].expand(tp, -1).clone()

            _STEP_OF[op](hidden, w, k, group=capture, **kw)
        assert handed == [(length,)] * tp, (handed, length)

        def gather(x):
            assert x.shape == (length,)
            for r in range(tp):
                buffer[r].copy_(frames[r])
            return buffer

        got = _STEP_OF[op](hidden, shards[0][0], k, group=gather, vocab_start=0, num_valid=shards[0][2].num_valid,
                           return_log_probs=log_probs)  # fmt: skip
        ids = got[0] if isinstance(got, tuple) else got
        if op == "argmax":
            check_against_reference(ids, hidden, full, min_clear_fraction=0.5)


_STEP_OF = {
    "argmax": lambda h, w, k, **kw: localargmax.lm_head_argmax(h, w, **kw),
    "topk": lambda h, w, k, **kw: localargmax.lm_head_topk(h, w, k, **kw),
    "sample": lambda h, w, k, **kw: localargmax.lm_head_sample(h, w, temperature=1.0, seed=7, **kw),
}


def test_payload_length_refuses_bad_sizes():
    assert localargmax.payload_length(4) == 4 + 3 and localargmax.payload_length(4, 8, True) == 32 + 4 + 3
    for bad in ({"batch": -1}, {"batch": 2, "k": 0}, {"batch": True}):
        with pytest.raises(ValueError, match="must be an int"):
            localargmax.payload_length(**bad)


def test_vllm_coordinator_gather_is_built_once_and_moves_bits():
    """The vLLM plugin's callable group on a GroupCoordinator is built once per
    coordinator (not a closure per step) and round-trips every word: padded to
    16 bytes, viewed as the plugin's payload_dtype (int32; float32 on vLLM's CPU
    shared-memory route) and back (the fake coordinator
    concatenates two ranks' copies, the second with every bit flipped)."""
    from localargmax.integrations.vllm import collective as plugin

    class Coordinator:  # vLLM's GroupCoordinator: a plain class (weak references allowed)
        def __init__(self, world_size, device_communicator, all_gather):
            self.world_size, self.device_communicator, self.all_gather = world_size, device_communicator, all_gather

    calls = []

    def all_gather(x, dim=0):
        calls.append((x.dtype, x.numel()))
        return torch.cat([x, (~x.view(torch.int32)).view(x.dtype)], dim=dim)  # bits flipped, any 4-byte dtype

    class _CPUSHMDistributed:  # vLLM's CPU shared-memory module: its all-gather takes floating dtypes only
        pass

    class CpuCommunicator:
        dist_module = _CPUSHMDistributed()

    coordinator = Coordinator(2, object(), all_gather)
    gather = plugin.coordinator_all_gather(coordinator)
    assert plugin.coordinator_all_gather(coordinator) is gather
    other = Coordinator(2, object(), all_gather)
    assert plugin.coordinator_all_gather(other) is not gather
    shm = Coordinator(2, CpuCommunicator(), all_gather)
    for route, view in ((gather, torch.int32), (plugin.coordinator_all_gather(shm), torch.float32)):
        for length in (3, 4, 7):  # odd lengths are padded to an even number of words (16 bytes)
            payload = torch.randint(-(2**63), 2**63 - 1, (length,), dtype=torch.int64)
            payload[0] = -1  # all bits set: a NaN pattern as float32 halves
            got = route(payload)
            assert got.shape == (2, length) and torch.equal(got[0], payload) and torch.equal(got[1], ~payload)
            assert calls[-1] == (view, 2 * (length + length % 2))
