"""Helpers of the fault-kind tests (tests/test_fault_kinds.py): a gloo launcher
with a short, configurable process-group timeout that never raises itself but
reports what every rank did (returned, raised, died, hung) and how long it
took, plus a /proc scan for processes left behind.

Everything here is a plain module-level function so that spawned ranks can
import it (tests/ is on sys.path via conftest.py; spawned children get the
parent's sys.path).
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from helpers import free_port, rank_in_group


class RankOutcome(NamedTuple):
    status: str  # "ok" (worker returned), "error" (worker raised), "died" (no report, nonzero exit), "hung"
    value: object  # the worker's return value, or the traceback text
    exitcode: Optional[int]
    pid: int


class Launch(NamedTuple):
    ranks: List[RankOutcome]
    wall_s: float  # from the first start() until every rank was done (or killed)
    pids: List[int]


def _rank_main(worker, rank, world_size, port, results, pg_timeout, env, barrier, args):
    for k, v in (env or {}).items():
        os.environ[k] = v
    rank_in_group(worker, rank, world_size, port, results, args, pg_timeout=pg_timeout, barrier=barrier)


START_METHOD = os.environ.get("LOCALARGMAX_FAULT_START", "forkserver")
"""forkserver: one server process imports torch and localargmax once, every
rank is then a cheap fork of it (0.4 s for a 3-rank launch instead of ~10 s of
spawned imports on 2 cores); the server never runs torch ops, so forking it is
safe. Set LOCALARGMAX_FAULT_START=spawn to use fresh interpreters instead."""

_PRELOAD = ["torch", "torch.distributed", "torch.distributed._functional_collectives", "localargmax", "helpers",
            "fault_helpers"]


def _context(worker):
    ctx = multiprocessing.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        # effective only until the server starts (the first launch)
        ctx.set_forkserver_preload(_PRELOAD + [worker.__module__])
    return ctx


def launch(
    worker: Callable,
    world_size: int,
    *args,
    pg_timeout: float = 5.0,
    wall_timeout: float = 90.0,
    env: Optional[Dict[str, str]] = None,
) -> Launch:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` spawned gloo
    ranks whose process group has ``timeout=pg_timeout`` seconds.

    Unlike helpers.run_ranks this never raises for a rank's failure: it waits
    until every rank has reported or exited (or ``wall_timeout`` passed: those
    ranks are "hung" and get killed), joins every process, and returns what
    each rank did. ``env`` is set in each rank before the worker runs.
    """
    ctx = _context(worker)
    results = ctx.Queue()
    barrier = ctx.Barrier(world_size)
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(worker, r, world_size, port, results, pg_timeout, env, barrier, args),
            daemon=True,
        )
        for r in range(world_size)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    pids = [p.pid for p in procs]
    reports: Dict[int, tuple] = {}
    deadline = t0 + wall_timeout
    try:
        while time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                reports[rank] = (status, value)
            except queue.Empty:
                pass
            if all(r in reports or procs[r].exitcode is not None for r in range(world_size)):
                # drain late reports of ranks that exited right after reporting
                time.sleep(0.3)
                try:
                    while True:
                        rank, status, value = results.get_nowait()
                        reports[rank] = (status, value)
                except queue.Empty:
                    pass
                break
    finally:
        hung = set()
        for r, p in enumerate(procs):
            if r not in reports and p.is_alive():
                hung.add(r)
                p.kill()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    wall = time.monotonic() - t0
    out = []
    for r, p in enumerate(procs):
        if r in reports:
            status, value = reports[r]
        elif r in hung:
            status, value = "hung", f"rank {r} neither reported nor exited within {wall_timeout} s"
        else:
            status, value = "died", f"rank {r} exited with code {p.exitcode} without reporting"
        out.append(RankOutcome(status, value, p.exitcode, p.pid))
    return Launch(out, wall, pids)


def timed(fn: Callable) -> dict:
    """Call ``fn()``; return ``{"ok", "value" | "error", "type", "elapsed"}``
    (picklable), the elapsed time measured around the call alone."""
    t = time.monotonic()
    try:
        value = fn()
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        return {"ok": True, "value": value, "elapsed": time.monotonic() - t}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "type": type(e).__name__, "error": str(e), "elapsed": time.monotonic() - t}


# ----------------------------------------------------------------------------
# Processes left behind
# ----------------------------------------------------------------------------


def _stat(pid: int):
    """(state, ppid, pgrp, session) of /proc/<pid>/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3])


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def all_pids() -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def live_descendants(pids) -> List[int]:
    """Live (non-zombie) processes among ``pids`` and all their descendants."""
    children: Dict[int, List[int]] = {}
    for pid in all_pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[1], []).append(pid)
    seen, stack = set(), list(pids)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stack.extend(children.get(pid, []))
    return sorted(pid for pid in seen if alive(pid))


def session_members(sid: int) -> List[int]:
    """Live processes whose session id is ``sid`` (or process group id is ``sid``)."""
    out = []
    for pid in all_pids():
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X") and (st[3] == sid or st[2] == sid):
            out.append(pid)
    return sorted(out)


def describe(pids) -> str:
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            cmd = "?"
        lines.append(f"{pid}: {cmd}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Simulated ranks (one process): shards, a callable all-gather, an emulated
# all-reduce MAX, exact integer problems and an exact top-k reference.
# ----------------------------------------------------------------------------

import localargmax  # noqa: E402

SIGN_BIT = -(2**63)
PAD_KINDS = ("direction", "nan", "inf", "bias_inf")


def int_problem(gen: torch.Generator, batch: int, vocab: int, hsize: int, dtype=torch.float32, bias: bool = False,
                ties: bool = True):
    """Small-integer hidden (nonzero, |h| <= 3) and weight (|w| <= 3), optional
    integer float32 bias: every logit is exact in float32 *and* float64, so
    the float64 reference decides ties exactly. ``ties`` copies random rows
    elsewhere (exact ties, across shards too)."""
    hidden = torch.randint(1, 4, (batch, hsize), generator=gen) * (torch.randint(0, 2, (batch, hsize), generator=gen) * 2 - 1)
    weight = torch.randint(-3, 4, (vocab, hsize), generator=gen)
    if ties and vocab > 1:
        n = max(1, vocab // 5)
        src = torch.randint(0, vocab, (n,), generator=gen)
        dst = torch.randint(0, vocab, (n,), generator=gen)
        weight[dst] = weight[src]
    b = torch.randint(-4, 5, (vocab,), generator=gen).to(torch.float32) if bias else None
    return hidden.to(dtype), weight.to(dtype), b


def make_shards(weight, bias, tp, pad_to, *, hidden=None, pad="direction"):
    """The ``tp`` standard-layout shards of the full ``weight [V, H]`` (and
    ``bias [V]``), with padding rows chosen to win if they were evaluated:

    * ``"direction"``: padding row i = 1024 * hidden[i % B] (the largest logit of
      that batch row by far: 1024 |h_b|^2);
    * ``"nan"``: NaN weights; ``"inf"``: +inf weights (logit +inf or NaN);
    * ``"bias_inf"``: direction weights and a +inf / NaN bias (a float32 bias is
      created if there is none).

    Returns ``[(weight_shard, bias_shard_or_None, VocabShard)]``.
    """
    assert pad in PAD_KINDS
    vocab, hsize = weight.shape
    shards = []
    for r in range(tp):
        s = localargmax.shard_vocab(vocab, r, tp, pad_to)
        w = torch.empty((s.rows, hsize), dtype=weight.dtype)
        w[: s.num_valid] = weight[s.vocab_start : s.vocab_start + s.num_valid]
        npad = s.rows - s.num_valid
        if npad:
            if pad == "nan":
                w[s.num_valid :] = float("nan")
            elif pad == "inf":
                w[s.num_valid :] = float("inf")
            else:
                src = hidden.float() if hidden is not None and hidden.shape[0] else torch.ones(1, hsize)
                idx = torch.arange(npad) % src.shape[0]
                w[s.num_valid :] = (src[idx] * 1024).to(weight.dtype)
        b = None
        if bias is not None or pad == "bias_inf":
            b = torch.zeros((s.rows,), dtype=torch.float32 if bias is None else bias.dtype)
            if bias is not None:
                b[: s.num_valid] = bias[s.vocab_start : s.vocab_start + s.num_valid]
            if npad:
                b[s.num_valid :] = float("inf") if pad == "bias_inf" else 1e4
                if pad == "bias_inf":
                    b[s.num_valid + 1 :: 2] = float("nan")
        shards.append((w, b, s))
    return shards


def full_bias(bias, shards, vocab):
    """The bias of the unpadded vocabulary as the shards see it (zeros where
    make_shards invented a bias for the padding)."""
    if bias is not None:
        return bias
    if all(b is None for _, b, _ in shards):
        return None
    return torch.zeros(vocab, dtype=torch.float32)


def shard_keys(hidden, shards) -> torch.Tensor:
    return torch.stack([
        localargmax.shard_argmax(hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b)
        for w, b, s in shards
    ])


def allreduce_max(keys: torch.Tensor) -> torch.Tensor:
    """What exchange_keys(reduce="all_reduce") computes: all-reduce MAX of the
    sign-flipped keys, flipped back: ``[1, B]``."""
    return ((keys ^ SIGN_BIT).max(dim=0).values ^ SIGN_BIT).unsqueeze(0)


def python_unsigned_max(keys: torch.Tensor) -> torch.Tensor:
    """The same, as plain Python unsigned 64-bit integers (independent of torch)."""
    from helpers import to_int64, to_uint64

    cols = keys.t().tolist()
    return torch.tensor([[to_int64(max(to_uint64(k) for k in col)) for col in cols]], dtype=torch.int64).view(1, -1)


def simulated_argmax(hidden, shards, *, d2t=None, reduce="all_gather"):
    """lm_head_argmax on every simulated rank; the collective is a callable
    that returns the stacked keys of all shards (all-gather) or their emulated
    all-reduce MAX (``[1, B]``). Asserts that every rank passes its own keys
    and that all ranks return the same ids; returns them."""
    from helpers import stack_frames

    frames = stack_frames(shard_keys(hidden, shards), [(s.vocab_start, s.num_valid) for _, _, s in shards])
    exchanged = frames if reduce == "all_gather" else allreduce_max(frames)
    out = None
    for r, (w, b, s) in enumerate(shards):
        def group(k, r=r):
            assert torch.equal(k, frames[r]), f"rank {r} passed keys that are not its shard's"
            return exchanged

        ids = localargmax.lm_head_argmax(hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b, d2t=d2t,
                                         group=group)
        assert out is None or torch.equal(ids, out), f"rank {r} disagrees: {ids.tolist()} vs {out.tolist()}"
        out = ids
    return out


def simulated_topk(hidden, shards, k, *, d2t=None):
    """lm_head_topk on every simulated rank with a callable all-gather of the
    ``[B, k]`` top-k keys; returns (ids, values) of rank 0 after checking all agree."""
    from helpers import stack_frames

    keys = [localargmax.shard_topk(hidden, w, k, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b)
            for w, b, s in shards]
    frames = stack_frames(keys, [(s.vocab_start, s.num_valid) for _, _, s in shards])
    out = None
    for r, (w, b, s) in enumerate(shards):
        def group(x, r=r):
            assert torch.equal(x, frames[r])
            return frames

        ids, values = localargmax.lm_head_topk(hidden, w, k, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b,
                                               d2t=d2t, group=group)
        assert out is None or torch.equal(ids, out[0]), f"rank {r} disagrees"
        out = (ids, values)
    return out


def ref_topk(logits64: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: the k best indices by (NaN first, larger value, smaller index)."""
    import math

    rows = []
    for row in logits64.tolist():
        order = sorted(range(len(row)), key=lambda v: (0, 0, v) if math.isnan(row[v]) else (1, -row[v], v))
        rows.append(order[:k])
    return torch.tensor(rows, dtype=torch.int64).view(len(rows), k)
