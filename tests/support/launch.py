"""The gloo multi-rank launcher, and the scan for processes left behind.

:func:`launch` runs ``worker(rank, world_size, *args)`` on ``world_size``
ranks (forked from a forkserver: one server imports torch and localargmax once,
each rank is a cheap fork of it; ``LOCALARGMAX_TEST_START=spawn`` uses fresh
interpreters) joined in a gloo process group over 127.0.0.1, and returns what
every rank did. :func:`run_ranks` is the same launch for tests whose ranks must
all succeed: it returns their values or raises :class:`RankFailure`.
:func:`run_bench` runs the benchmark CLI (which launches its own ranks),
:func:`kernel_smoke` its ``--kernel-only --smoke`` run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import NamedTuple

import torch

from localargmax import envs

START_METHOD = envs.LOCALARGMAX_TEST_START
_PRELOAD = ["torch", "torch.distributed", "torch.distributed._functional_collectives", "localargmax", __name__]


class RankOutcome(NamedTuple):
    status: str  # "ok" (returned), "error" (raised), "died" (exited without a report), "hung" (killed)
    value: object  # the worker's return value, or a traceback / message
    exitcode: int | None
    pid: int


class Launch(NamedTuple):
    ranks: list[RankOutcome]
    wall_s: float  # from the first start() until every rank was done (or killed)
    pids: list[int]


class RankFailure(AssertionError):
    """One or more ranks raised, crashed, or did not finish in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(worker, rank, world_size, port, results, pg_timeout, env, barrier, args):
    """One rank: init the gloo group, run the worker, report ``(rank, status,
    value)`` before tearing the group down (the peers then fail with
    "connection closed", and the root cause must arrive first)."""
    os.environ.update(env or {})
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        barrier.wait(timeout=120)  # every rank is up before a short-timeout rendezvous starts
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        results.put((rank, "ok", worker(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def _drain(results, reports):
    try:
        while True:
            rank, status, value = results.get_nowait()
            reports[rank] = (status, value)
    except queue.Empty:
        pass


def launch(
    worker: Callable,
    world_size: int,
    *args,
    pg_timeout: float = 120.0,
    wall_timeout: float = 240.0,
    env: dict[str, str] | None = None,
    fail_fast: bool = False,
    start_method: str | None = None,
) -> Launch:
    """Run ``worker(rank, world_size, *args)`` (a module-level function) on
    ``world_size`` gloo ranks whose group has ``timeout=pg_timeout`` seconds;
    ``env`` is set in each rank first. Waits until every rank has reported or
    exited; ranks still running after ``wall_timeout`` seconds (or, with
    ``fail_fast``, 3 s after the first rank failed) are killed and reported
    "hung". Every process is joined before this returns. ``start_method``:
    another than :data:`START_METHOD` ("spawn": ranks that see this process's
    environment as it is now, not the forkserver's)."""
    method = start_method or START_METHOD
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD + [worker.__module__])  # effective until the server starts
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
    reports: dict[int, tuple] = {}
    deadline = t0 + wall_timeout
    try:
        while time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                reports[rank] = (status, value)
            except queue.Empty:
                pass
            if all(r in reports or procs[r].exitcode is not None for r in range(world_size)):
                time.sleep(0.3)  # late reports of ranks that exited right after reporting
                _drain(results, reports)
                break
            failed = any(s != "ok" for s, _ in reports.values()) or any(
                p.exitcode not in (None, 0) for r, p in enumerate(procs) if r not in reports
            )
            if fail_fast and failed:
                deadline = min(deadline, time.monotonic() + 3.0)  # collect the others' reports for a moment
    finally:
        hung = {r for r, p in enumerate(procs) if r not in reports and p.is_alive()}
        for r in hung:
            procs[r].kill()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        _drain(results, reports)
        results.close()
    out = []
    for r, p in enumerate(procs):
        if r in reports:
            status, value = reports[r]
        elif r in hung:
            status, value = "hung", f"rank {r} did not finish within {time.monotonic() - t0:.0f} s (hang?)"
        else:
            status, value = "died", f"rank {r} exited with code {p.exitcode} without reporting"
        out.append(RankOutcome(status, value, p.exitcode, p.pid))
    return Launch(out, time.monotonic() - t0, [p.pid for p in procs])


def run_ranks(
    worker: Callable, world_size: int, *args, timeout: float = 240.0, start_method: str | None = None
) -> list:
    """:func:`launch` with ``fail_fast``: the ranks' return values (plain
    picklable data) by rank, or :class:`RankFailure` naming every rank that
    raised (with its traceback), died or hung."""
    result = launch(worker, world_size, *args, wall_timeout=timeout, fail_fast=True, start_method=start_method)
    bad = [f"rank {r} {o.status}:\n{o.value}" for r, o in enumerate(result.ranks) if o.status != "ok"]
    if bad:
        raise RankFailure("\n".join(bad))
    return [o.value for o in result.ranks]


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


# ----------------------------------------------------------------------------- processes left behind


def _stat(pid: int):
    """(state, ppid, pgrp, session) of /proc/<pid>/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3])


def _live_stats():
    out = {}
    for d in os.listdir("/proc"):
        st = _stat(int(d)) if d.isdigit() else None
        if st is not None and st[0] not in ("Z", "X"):
            out[int(d)] = st
    return out


def live_descendants(pids) -> list[int]:
    """Live (non-zombie) processes among ``pids`` and all their descendants."""
    stats = _live_stats()
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st[1], []).append(pid)
    seen, stack = set(), list(pids)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, []))
    return sorted(pid for pid in seen if pid in stats)


def session_members(sid: int) -> list[int]:
    """Live processes whose session id (or process group id) is ``sid``."""
    return sorted(pid for pid, st in _live_stats().items() if sid in (st[3], st[2]))


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


def run_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m localargmax.bench *args`` in a subprocess, offline and never
    as one rank of an outer torchrun; its output captured as text."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "localargmax.bench", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def kernel_smoke(tmp_path, *args: str):
    """A successful ``--kernel-only --smoke`` run of ``args`` writing JSON under
    ``tmp_path``: ``(process, its rows, the JSON path)``."""
    out = tmp_path / "k.json"
    proc = run_bench("--kernel-only", "--smoke", "--no-progress", "--json", str(out), *args, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())["rows"], out
