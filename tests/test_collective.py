"""exchange_keys, the one collective: its argument checks, callable groups,
the cupy communicator message; and its fault families on real gloo ranks: the
layout of the gathered buffer ([tp, B], and the sign flip of the all-reduce),
ranks that disagree (LOCALARGMAX_DEBUG per-step checks, a batch mismatch
without them), and a rank that dies, raises or never arrives (the others
raise instead of hanging, and no process is left behind). Also the test
launcher's own behaviour on failures and hangs."""

from __future__ import annotations

import math
import os
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import localargmax
from tests.conftest import draw_seed
from tests.support.checks import raises_cleanly
from tests.support.launch import Launch, RankOutcome, describe, launch, live_descendants, timed
from tests.support.problems import (
    layout_kwargs,
    make_shards,
    shard_keys,
    simulated_argmax,
    simulated_topk,
    stack_frames,
)
from tests.support.reference import check_against_reference, ref_argmax

H, ROWS, B = 8, 6, 3
KEYS = torch.tensor([5, -7, 9], dtype=torch.int64)

# ----------------------------------------------------------------------------- bad input

ENTRIES = {  # exchange_keys and lm_head_argmax (which passes its group and reduce through)
    "exchange_keys": lambda group, reduce="all_gather": localargmax.exchange_keys(KEYS, group, reduce),
    "lm_head_argmax": lambda group, reduce="all_gather": localargmax.lm_head_argmax(
        torch.randn(B, H), torch.randn(ROWS, H), group=group, reduce=reduce
    ),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("reduce", ["sum", "max", "MAX", "ALL_GATHER", "allgather", None, 0])
@pytest.mark.parametrize("group", [None, "callable"])
def test_unknown_reduce_mode(entry, reduce, group):
    with pytest.raises(ValueError, match="reduce must be one of"):
        ENTRIES[entry]((lambda k: k.unsqueeze(0)) if group else None, reduce)
    raises_cleanly(ValueError, "reduce must be one of", localargmax.exchange_keys, KEYS.view(3, 1), None, reduce)


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("group", ["world", 2, 42, object()], ids=["str", "int2", "int42", "object"])
def test_bad_group_type(entry, group):
    with pytest.raises(TypeError, match=r"group must be None, localargmax\.LOCAL_SHARD, a torch\.distributed"):
        ENTRIES[entry](group)


BAD_CALLABLES = {
    "returns_own_keys": lambda k: k,
    "returns_3d": lambda k: k.view(1, 1, -1),
    "returns_short": lambda k: k[None, :2],
    "returns_list": lambda k: k.tolist(),
    "returns_none": lambda k: None,
}


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("case", list(BAD_CALLABLES))
def test_callable_group_must_return_tp_by_batch_keys(entry, case):
    # lm_head_argmax frames its 3 keys with the 3-word header: the callable sees 6
    with pytest.raises(ValueError, match=r"group callable must return \[tp, [36]\], an all-gather of the \([36],\)"):
        ENTRIES[entry](BAD_CALLABLES[case])


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_callable_group_cannot_all_reduce(entry):
    with pytest.raises(ValueError, match="callable.*reduce='all_gather'"):
        ENTRIES[entry](lambda k: k[None], "all_reduce")


def test_all_reduce_needs_top1_keys():
    topk = torch.ones(B, 4, dtype=torch.int64)
    raises_cleanly(ValueError, "all_reduce.*\\[B\\]", localargmax.exchange_keys, topk, None, "all_reduce")
    raises_cleanly(ValueError, "all_reduce", localargmax.exchange_keys, topk, lambda k: k[None], "all_reduce")


@pytest.mark.parametrize(
    "keys",
    [[5, -7, 9], torch.tensor([1.0, 2.0]), torch.tensor([1, 2], dtype=torch.int32)],
    ids=["list", "float32", "int32"],
)
def test_rejects_non_int64_keys(keys):
    """Packed keys are int64; anything else must not travel through a collective."""
    raises_cleanly(TypeError, "keys", localargmax.exchange_keys, keys, None)


FAKE_NCCL_COMM = types.SimpleNamespace(size=lambda: 1, rank_id=lambda: 0, allGather=None, allReduce=None)
"""Duck-types cupy.cuda.nccl.NcclCommunicator's pointer API (never reached without cupy)."""


def test_cupy_communicator_without_cupy_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(ImportError, match=r"localargmax\[cupy\]"):
        localargmax.lm_head_argmax(torch.randn(2, 8), torch.randn(100, 8), group=FAKE_NCCL_COMM)


def test_fallback_frames_share_the_key_frames_header(gen):
    """The fallback gather's frame (collective.frame_logits) is the one frame
    of every exchange: ``[size, -size, vocab_end]`` (the size flagged
    LOGITS_FLAG), then ``[vocab_start, n, rows]`` and the float32 bits; read
    back, each shard's valid columns land at their place, NaN in the gaps.
    Ranks that sent other row counts, or a key frame, are refused alike."""
    from localargmax import collective

    a, b = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    fa, fb = collective.frame_logits(a, 0, 4), collective.frame_logits(b, 6, 5)
    assert fa.shape[0] == collective.logits_payload_length(3, 5)
    size = fa.shape[0] - collective.HEADER_LEN + 1 + collective.LOGITS_FLAG
    assert fa[: collective.HEADER_LEN].tolist() == [size, -size, 4]
    assert fa[collective.HEADER_LEN : collective.HEADER_LEN + 3].tolist() == [0, 3, 5]
    full = collective.logits_from_frames(torch.stack([fa, fb]))
    assert full.shape == (3, 11)
    assert torch.equal(full[:, :4], a[:, :4]) and torch.equal(full[:, 6:], b)
    assert full[:, 4:6].isnan().all()
    empty = collective.frame_logits(b, 11, 0)  # a shard with no id: vocab_end 0, nothing placed
    assert empty[2] == 0 and torch.equal(collective.logits_from_frames(torch.stack([fa, empty])), a[:, :4])
    other = collective.frame_logits(torch.randn(5, 3, generator=gen), 6, 3)  # 15 values too: the rows differ
    keys = collective.frame_keys(torch.arange(1, 9), 4)
    keys = torch.cat([keys, keys.new_zeros(fa.shape[0] - keys.shape[0])])
    for bad in (other, keys):
        with pytest.raises(ValueError, match=r"disagree on the fallback gather \(rows, shard rows\)"):
            collective.logits_from_frames(torch.stack([fa, bad]))


def test_world_size_one_is_the_keys_themselves(gen):
    keys = localargmax.shard_argmax(torch.randn(9, 50, generator=gen), torch.randn(300, 50, generator=gen))
    for reduce in ("all_gather", "all_reduce"):
        assert torch.equal(localargmax.exchange_keys(keys, None, reduce), keys.unsqueeze(0))


def test_callable_group_is_an_all_gather(gen):
    """A callable that plays the other ranks in one process: every "rank" gets
    the argmax over the concatenation of every rank's shard."""
    hidden = torch.randn(5, 16, generator=gen)
    weight = torch.randn(900, 16, generator=gen)
    shards = make_shards(weight, None, 3, 64, hidden=hidden)
    keys = stack_frames(shard_keys(hidden, shards), [(s.vocab_start, s.num_valid) for _, _, s in shards])
    got = [localargmax.lm_head_argmax(hidden, sh[0], **layout_kwargs(sh), group=lambda k: keys) for sh in shards]
    assert all(torch.equal(ids, got[0]) for ids in got), got
    check_against_reference(got[0], hidden, weight)  # random data: near-ties judged with the float32 error bound


# ----------------------------------------------------------------------------- the gathered buffer's layout


def layout_case(seed: int, tp: int, batch: int):
    """hidden [B, H], the full weight and bias, with the winner of batch row b
    planted on rank (b + tp - 1) % tp: row 0's winner sits on the last rank,
    whose keys a [B, tp] reading of the rank-major [tp, B] buffer never puts in
    column 0 (for B >= 2), so the misread changes row 0's id for sure. Hidden
    rows are orthogonal (a plant wins only its own row). The bias (-20 on
    planted rows, -50 elsewhere) makes the other ranks' best logits negative
    and the winner's positive: their keys differ in the top bit, so a signed
    max (an all-reduce without the sign flip) picks a loser.
    Returns (hidden, weight, bias, winners)."""
    gen = torch.Generator().manual_seed(seed)
    hsize, vocab = 64, 50 * tp + 7
    q, _ = torch.linalg.qr(torch.randn(hsize, hsize, generator=gen, dtype=torch.float64))
    hidden = (q[:batch] * math.sqrt(hsize)).float()
    weight = torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize) * 0.5
    layouts = [localargmax.shard_vocab(vocab, r, tp, 64) for r in range(tp)]
    winners = []
    for b in range(batch):
        s = layouts[(b + tp - 1) % tp]
        v = s.vocab_start + int(torch.randint(0, s.num_valid, (1,), generator=gen))
        while v in winners:
            v = s.vocab_start + int(torch.randint(0, s.num_valid, (1,), generator=gen))
        winners.append(v)
        weight[v] = 40 * hidden[b] / (hidden[b] @ hidden[b])
    bias = torch.full((vocab,), -50.0)
    bias[winners] = -20.0  # +20 for its own batch row, about -20 for the others
    return hidden, weight, bias, torch.tensor(winners)


def check_layout_case_discriminates(hidden, weight, bias, winners):
    """The data can tell a right layout from a wrong one: the rank-major buffer
    misread as [B, tp], or a signed max of the keys (no sign flip), give other ids."""
    assert torch.equal(ref_argmax(hidden, weight, bias), winners)
    tp = (weight.shape[0] - 7) // 50
    keys = shard_keys(hidden, make_shards(weight, bias, tp, 64, hidden=hidden))
    batch = keys.shape[1]
    if batch > 1:
        misread = keys.reshape(-1).view(batch, tp).t()
        assert not torch.equal(localargmax.merge_keys(misread)[0], winners), f"tp={tp} B={batch}"
    assert not torch.equal(localargmax.merge_keys(keys.max(dim=0, keepdim=True).values)[0], winners)


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_gathered_layout_callable_group(seed, tp):
    """Fault family, layout of the gathered buffer, with simulated ranks."""
    for batch in sorted({1, 2, tp, tp + 1, 2 * tp + 1, 7}):
        hidden, weight, bias, winners = layout_case(seed + batch, tp, batch)
        check_layout_case_discriminates(hidden, weight, bias, winners)
        shards = make_shards(weight, bias, tp, 64, hidden=hidden)
        assert torch.equal(simulated_argmax(hidden, shards), winners), f"tp={tp} B={batch}"
        assert torch.equal(simulated_argmax(hidden, shards, reduce="all_reduce"), winners)
        assert torch.equal(simulated_topk(hidden, shards, 2)[0][:, 0], winners), f"top-k tp={tp} B={batch}"


# ----------------------------------------------------------------------------- real gloo ranks

PG_TIMEOUT = 5.0  # gloo process-group timeout of the fault launches (seconds)
RAISE_BOUND = 12 * PG_TIMEOUT
"""A survivor must raise within this many seconds of entering the collective:
loose enough for a 2-core machine at load 9 (5-24 s measured there), far below
what a hang looks like (the absent rank stays away ABSENT_S seconds)."""
ABSENT_S = 150.0
FAULT_WALL_TIMEOUT = 210.0  # a launch still running then counts as a hang (its ranks are killed)


def _healthy_worker(rank, world, seed):
    """3 healthy ranks: the gathered layout on gloo (tp 2, 3; both reduce
    modes) and the LOCALARGMAX_DEBUG per-step checks (one rank with another
    batch / hidden size / d2t length; the group works after the refusals)."""
    groups = {2: dist.new_group([0, 1]), 3: dist.group.WORLD}
    out = {}
    for tp in (tp for tp in (2, 3) if rank < tp):
        for batch in sorted({1, 2, tp, tp + 1, 5}):
            hidden, weight, bias, winners = layout_case(seed + 100 * tp + batch, tp, batch)
            shard = make_shards(weight, bias, tp, 64, hidden=hidden)[rank]
            for reduce in ("all_gather", "all_reduce"):
                step = dict(layout_kwargs(shard), group=groups[tp], reduce=reduce)
                out[("layout", tp, batch, reduce)] = timed(lambda: localargmax.lm_head_argmax(hidden, shard[0], **step))
    os.environ["LOCALARGMAX_DEBUG"] = "1"
    for tp in (tp for tp in (2, 3) if rank < tp):
        odd, group, weight = rank == tp - 1, groups[tp], torch.randn(64, 8)
        for reduce in ("all_gather", "all_reduce"):
            step = dict(vocab_start=rank * 64, group=group, reduce=reduce)
            out[("debug_batch", tp, reduce)] = timed(
                lambda: localargmax.lm_head_argmax(torch.randn(5 if odd else 4, 8), weight, **step)
            )
            hsize = 9 if odd else 8
            out[("debug_hidden", tp, reduce)] = timed(
                lambda: localargmax.lm_head_argmax(torch.randn(4, hsize), torch.randn(64, hsize), **step)
            )
            d2t = torch.zeros(64 * tp + odd, dtype=torch.int64)
            out[("debug_d2t", tp, reduce)] = timed(
                lambda: localargmax.lm_head_argmax(torch.randn(4, 8), weight, d2t=d2t, **step)
            )
            torch.manual_seed(seed)  # the same hidden states on every rank
            h = torch.randn(4, 8)
            out[("debug_after", tp, reduce)] = timed(lambda: localargmax.lm_head_argmax(h, weight, **step))
    if rank < 2:  # every input that changes what a rank sends, varied on rank 1 (tp 2)
        weight = torch.randn(64, 8)
        for vary, ops in PAYLOAD_OPS.items():
            for op in ops:
                out[("payload", vary, op)] = timed(_payload_call(op, rank == 1, vary, groups[2], rank, weight, seed))
    return out


PAYLOAD_OPS = {  # localargmax.engine.PAYLOAD_INPUTS -> the steps that take the input
    "batch size": ("argmax", "topk", "sample"),
    "k": ("topk",),
    "return_log_probs": ("argmax", "topk", "sample"),
    "return_log_odds": ("argmax",),
    "reduce": ("argmax", "sample"),
}


def _payload_call(op, odd, vary, group, rank, weight, seed):
    """The step ``op`` as rank ``rank`` calls it, the input ``vary`` differing on the odd rank."""
    torch.manual_seed(seed)
    hidden = torch.randn(5 if odd and vary == "batch size" else 4, 8)
    kw = dict(vocab_start=rank * 64, group=group, return_log_probs=odd and vary == "return_log_probs")
    reduce = "all_reduce" if odd and vary == "reduce" else "all_gather"
    if op == "topk":
        return lambda: localargmax.lm_head_topk(hidden, weight, 3 if odd and vary == "k" else 2, **kw)[0]
    if op == "argmax":
        odds = odd and vary == "return_log_odds"
        return lambda: localargmax.lm_head_argmax(hidden, weight, reduce=reduce, return_log_odds=odds, **kw)
    return lambda: localargmax.lm_head_sample(hidden, weight, temperature=1.0, seed=0, reduce=reduce, **kw)


def _faulty_worker(rank, world, mode, reduce, marker_dir, absent_s):
    """The last rank misbehaves before the collective; the others call
    lm_head_argmax and report how it ended and how long the call took.
    mode: "exit" (os._exit(1)), "raise" (an exception: the rank tears its
    group down and exits), "absent" (alive, never arrives: it leaves once the
    others are done, or after ``absent_s``), "batch" (another batch size, no
    LOCALARGMAX_DEBUG)."""
    bad = rank == world - 1
    torch.manual_seed(1234)
    hidden = torch.randn(3 if (bad and mode == "batch") else 4, 8)
    weight = torch.randn(16, 8)
    dist.barrier()  # the group is fully connected before anyone misbehaves
    if bad and mode == "exit":
        os._exit(1)
    if bad and mode == "raise":
        raise RuntimeError("rank failed before the collective")
    if bad and mode == "absent":
        deadline, others = time.monotonic() + absent_s, [Path(marker_dir, f"done.{r}") for r in range(world - 1)]
        while time.monotonic() < deadline and not all(p.exists() for p in others):
            time.sleep(0.05)
        return {"absent": True, "others_done": all(p.exists() for p in others)}
    result = timed(
        lambda: localargmax.lm_head_argmax(hidden, weight, vocab_start=rank * 16, group=dist.group.WORLD, reduce=reduce)
    )
    Path(marker_dir, f"done.{rank}").touch()
    return result


FAULT_LAUNCHES = {  # name: (mode, reduce, world size, process-group timeout, absent rank's stay); slow ones first
    "absent_past_bound": ("absent", "all_gather", 2, 600.0, RAISE_BOUND + 5),
    "absent": ("absent", "all_gather", 3, PG_TIMEOUT, ABSENT_S),
    "absent_allreduce": ("absent", "all_reduce", 2, PG_TIMEOUT, ABSENT_S),
    "batch_allreduce": ("batch", "all_reduce", 2, PG_TIMEOUT, ABSENT_S),
    "exit": ("exit", "all_gather", 3, PG_TIMEOUT, ABSENT_S),
    "exit_allreduce": ("exit", "all_reduce", 2, PG_TIMEOUT, ABSENT_S),
    "raise": ("raise", "all_gather", 2, PG_TIMEOUT, ABSENT_S),
    "batch": ("batch", "all_gather", 2, PG_TIMEOUT, ABSENT_S),
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every multi-rank launch of this module, three at a time (most of their
    time is spent waiting for timeouts). Returns {name: Future[Launch]}, and
    the seed of the healthy launch as ``["seed"]``."""
    seed = draw_seed()
    print(f"multi-rank launches, seed {seed}")
    pool = ThreadPoolExecutor(max_workers=3)
    futures = {"healthy": pool.submit(launch, _healthy_worker, 3, seed, pg_timeout=60.0, wall_timeout=180.0)}
    for name, (mode, reduce, world, pg_timeout, absent_s) in FAULT_LAUNCHES.items():
        marker = str(tmp_path_factory.mktemp(name))
        futures[name] = pool.submit(
            launch,
            _faulty_worker,
            world,
            mode,
            reduce,
            marker,
            absent_s,
            pg_timeout=pg_timeout,
            wall_timeout=FAULT_WALL_TIMEOUT,
        )
    yield futures, seed
    pool.shutdown(wait=True)


def assert_clean_exit(result: Launch):
    """No rank hung (was killed at the wall timeout) and no process is left behind."""
    assert not any(r.status == "hung" for r in result.ranks), [r.value for r in result.ranks]
    left = live_descendants(result.pids)
    assert not left, f"processes left behind:\n{describe(left)}"


def assert_survivors_raised_in_time(result: Launch, world: int):
    """Every rank but the last returned from the worker, having raised from
    lm_head_argmax within RAISE_BOUND seconds of entering it."""
    for r in range(world - 1):
        o = result.ranks[r]
        assert o.status == "ok", f"rank {r}: {o.status} {o.value}"
        assert not o.value["ok"], f"rank {r} returned ids {o.value.get('value')} although a rank never contributed"
        assert o.value["elapsed"] < RAISE_BOUND, f"rank {r} took {o.value['elapsed']:.1f} s to raise"
        print(f"rank {r} raised {o.value['type']} after {o.value['elapsed']:.2f} s: {o.value['error'][:120]}")


def _healthy(launches):
    futures, seed = launches
    result = futures["healthy"].result()
    assert_clean_exit(result)
    assert all(o.status == "ok" for o in result.ranks), [o.value for o in result.ranks]
    return [o.value for o in result.ranks], seed


@pytest.mark.parametrize("tp", [2, 3])
def test_gathered_layout_real_gloo(launches, tp):
    per_rank, seed = _healthy(launches)
    for batch in sorted({1, 2, tp, tp + 1, 5}):
        hidden, weight, bias, winners = layout_case(seed + 100 * tp + batch, tp, batch)
        check_layout_case_discriminates(hidden, weight, bias, winners)
        for reduce in ("all_gather", "all_reduce"):
            for r in range(tp):
                res = per_rank[r][("layout", tp, batch, reduce)]
                assert res["ok"] and res["value"] == winners.tolist(), f"rank {r} tp={tp} B={batch} {reduce}: {res}"


@pytest.mark.parametrize("tp", [2, 3])
@pytest.mark.parametrize("reduce", ["all_gather", "all_reduce"])
def test_debug_flag_names_disagreeing_ranks(launches, tp, reduce):
    per_rank, _ = _healthy(launches)
    odd, good = tp - 1, list(range(tp - 1))
    for field, name, values in (
        ("debug_batch", "batch size", (4, 5)),
        ("debug_hidden", "hidden size", (8, 9)),
        ("debug_d2t", "d2t length", (64 * tp, 64 * tp + 1)),
    ):
        for r in range(tp):
            res = per_rank[r][(field, tp, reduce)]
            assert not res["ok"] and res["type"] == "ValueError", f"{field} rank {r}: {res}"
            assert f"LOCALARGMAX_DEBUG: ranks disagree on {name}" in res["error"]
            assert f"ranks {good}: {values[0]}" in res["error"] and f"ranks [{odd}]: {values[1]}" in res["error"], res
    after = [per_rank[r][("debug_after", tp, reduce)] for r in range(tp)]
    assert all(a["ok"] and a["value"] == after[0]["value"] for a in after), after


def test_debug_flag_compares_every_payload_input(launches):
    """LOCALARGMAX_DEBUG=1: ranks that differ in any input that changes the
    exchange's payload (the list lives in localargmax.engine.PAYLOAD_INPUTS) all
    raise ValueError naming it, before the collective."""
    from localargmax.engine import PAYLOAD_INPUTS

    assert set(PAYLOAD_OPS) == set(PAYLOAD_INPUTS), "a payload input without a multi-rank case"
    per_rank, _ = _healthy(launches)
    for vary, ops in PAYLOAD_OPS.items():
        for op in ops:
            for r in range(2):
                res = per_rank[r][("payload", vary, op)]
                assert not res["ok"] and res["type"] == "ValueError", f"{vary}/{op} rank {r}: {res}"
                assert f"LOCALARGMAX_DEBUG: ranks disagree on {vary}" in res["error"], res


def _fault(launches, name):
    result = launches[0][name].result()
    assert_clean_exit(result)
    for r, o in enumerate(result.ranks):
        print(f"{name} rank {r}: {o.status} exit={o.exitcode} {str(o.value)[:300]}")
    return result, FAULT_LAUNCHES[name][2]


@pytest.mark.parametrize("name", ["exit", "exit_allreduce", "raise", "absent", "absent_allreduce"])
def test_bad_rank_survivors_raise_instead_of_hanging(launches, name):
    """A rank that dies (os._exit), raises before the collective, or never
    arrives: every other rank raises from lm_head_argmax (timed from its entry
    into the call) well before the absent rank would have come back, nobody
    hangs, and no process is left behind."""
    result, world = _fault(launches, name)
    bad = result.ranks[world - 1]
    if name.startswith("exit"):
        assert bad.status == "died" and bad.exitcode == 1
    elif name == "raise":
        assert bad.status == "error" and "rank failed before the collective" in bad.value
    else:
        assert bad.status == "ok" and bad.value["others_done"], bad.value
    assert_survivors_raised_in_time(result, world)


def test_the_time_check_fails_on_a_real_hang(launches):
    """With a 600 s process-group timeout the survivor really waits for the
    absent rank, which comes back after RAISE_BOUND + 5 s: the check above must
    fail on it (and a survivor that never returns is killed and reported "hung")."""
    result, world = _fault(launches, "absent_past_bound")
    with pytest.raises(AssertionError, match="to raise|returned ids"):
        assert_survivors_raised_in_time(result, world)
    hung = Launch([RankOutcome("hung", "killed", -9, 1)], 150.0, [])
    with pytest.raises(AssertionError):
        assert_clean_exit(hung)


@pytest.mark.parametrize("name", ["batch", "batch_allreduce"])
def test_batch_mismatch_without_debug_does_not_hang(launches, name):
    """Without LOCALARGMAX_DEBUG a rank with another batch size is undefined
    behaviour (documented in lm_head_argmax). On gloo: no rank hangs, no
    process is left behind, and at least one rank fails loudly (gloo aborts a
    rank on the message size mismatch, its peers see the connection close). A
    rank may still return ids; those are printed."""
    result, world = _fault(launches, name)
    loud = 0
    for r, o in enumerate(result.ranks):
        if o.status in ("died", "error") or not o.value["ok"]:
            loud += 1
        else:
            assert o.value["elapsed"] < RAISE_BOUND
            print(f"{name}: rank {r} RETURNED ids {o.value['value']}")
    assert loud >= 1, "the batch mismatch went entirely unnoticed"
