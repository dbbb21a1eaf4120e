"""``localargmax-bench --host-time``: what the step costs around the kernel.

One process, world size 1, a shard small enough that the kernel is
negligible (64 rows x 64 hidden float32 by default): per method, the wall
time per call (Python, dispatch and the tiny kernel) and the ops one call
dispatches (counted with a ``TorchDispatchMode``, once on the host path and
once on the device path, ``host_checks`` forced False as on CUDA), side by
side in one run. The methods:

* ``fused-op``: :func:`localargmax.shard_argmax` alone (the bare op);
* ``planned-step``: :meth:`localargmax.StepPlan.run` (planned once);
* ``step``: :func:`localargmax.lm_head_argmax` (plans, then runs, per call);
* ``vllm-local-argmax``: vLLM's own local argmax, the sequence of torch ops
  the seed's ``get_top_tokens`` runs (:func:`localargmax.baselines.unfused_local_argmax`:
  matmul, local max, offset, stack, (all-gather), argmax, gather, ``d2t``).

Every method runs ``--steps`` calls per repeat, the methods interleaved, for
``--repeats`` repeats; the table gives the median and the min-max over the
repeats, and ``over fused-op`` the median difference to the bare op. A
verdict is printed only where the spreads separate."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import StepPlan, _validation, baselines, decode_keys, lm_head_argmax, shard_argmax
from .report import env_info, write_output

METHODS = ("fused-op", "planned-step", "step", "vllm-local-argmax")
TARGET_US = 15.0
"""Issue #65's target: the step's time over the bare op, in µs per call."""


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _methods(hidden, weight, d2t) -> dict:
    plan = StepPlan(weight, d2t=d2t)
    return {
        "fused-op": lambda: shard_argmax(hidden, weight),
        "planned-step": lambda: plan.run(hidden),
        "step": lambda: lm_head_argmax(hidden, weight, d2t=d2t),
        "vllm-local-argmax": lambda: baselines.unfused_local_argmax(hidden, weight, d2t=d2t),
    }


def count_ops(fn, device_path: bool) -> list[str]:
    """The ops one call of ``fn`` dispatches (``device_path``: ``host_checks`` forced False)."""
    saved = _validation.host_checks
    if device_path:
        _validation.host_checks = lambda t: False
    try:
        with _Count() as c:
            fn()
    finally:
        _validation.host_checks = saved
    return c.ops


def measure(batch: int, rows: int, hidden_size: int, steps: int, repeats: int, device: str, seed: int) -> list[dict]:
    """The rows of one batch size: per method, µs per call (median, min, max over the repeats) and the ops."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, hidden_size, generator=gen).to(device)
    weight = torch.randn(rows, hidden_size, generator=gen).to(device)
    d2t = torch.zeros(rows, dtype=torch.int64, device=device)
    methods = _methods(hidden, weight, d2t)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    want = methods["step"]()
    for name, fn in methods.items():  # warm-up, and every method gives the step's ids
        for _ in range(max(3, steps // 10)):
            out = fn()
        ids = decode_keys(out)[0] if name == "fused-op" else out
        if not torch.equal(ids.cpu(), want.cpu()):
            raise AssertionError(f"--host-time: {name} gave other ids than the step")
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():  # interleaved: a slow moment of the machine hits every method
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            times[name].append((time.perf_counter() - t0) / steps * 1e6)
    base = statistics.median(times["fused-op"])
    rows_out = []
    for name, fn in methods.items():
        med = statistics.median(times[name])
        rows_out.append(
            {
                "method": name,
                "batch": batch,
                "us_per_call": round(med, 2),
                "us_min": round(min(times[name]), 2),
                "us_max": round(max(times[name]), 2),
                "over_fused_op_us": round(med - base, 2),
                "ops_host_path": len(count_ops(fn, False)),
                "ops_device_path": len(count_ops(fn, True)),
                "ops_device_path_names": count_ops(fn, True),
            }
        )
    return rows_out


def verdict(rows: list[dict]) -> list[str]:
    """One line per batch: the planned step's time over the bare op against
    :data:`TARGET_US`, or "within noise" where the repeats' spreads overlap."""
    lines = []
    for batch in sorted({r["batch"] for r in rows}):
        by = {r["method"]: r for r in rows if r["batch"] == batch}
        bare, plan = by["fused-op"], by["planned-step"]
        low, high = plan["us_min"] - bare["us_max"], plan["us_max"] - bare["us_min"]
        if high <= TARGET_US:
            lines.append(f"B={batch}: planned step over the bare op {plan['over_fused_op_us']} µs <= {TARGET_US} µs")
        elif low > TARGET_US:
            lines.append(f"B={batch}: planned step over the bare op {plan['over_fused_op_us']} µs > {TARGET_US} µs")
        else:
            lines.append(
                f"B={batch}: planned step over the bare op {plan['over_fused_op_us']} µs (spread {low:.1f} to "
                f"{high:.1f}): within noise of {TARGET_US} µs; more --repeats on a quieter machine would settle it"
            )
    return lines


def format_table(rows: list[dict]) -> str:
    head = ("batch", "method", "µs/call (median)", "min-max", "over fused-op", "ops (host)", "ops (device path)")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(
            " | ".join(
                str(x)
                for x in (
                    r["batch"],
                    r["method"],
                    r["us_per_call"],
                    f"{r['us_min']}-{r['us_max']}",
                    r["over_fused_op_us"],
                    r["ops_host_path"],
                    r["ops_device_path"],
                )
            )
        )
    return "\n".join(lines)


def run_host_time(args, command: list[str]) -> int:
    """The ``--host-time`` run of the CLI: the table (and verdicts) to stdout, JSON to ``--json``."""
    batches = [int(b) for b in args.batch.split(",")] if args.batch else [1, 8]
    threads = args.threads or 1
    torch.set_num_threads(threads)
    steps = args.steps or 2000
    rows = []
    for batch in batches:
        rows += measure(batch, args.rows or 64, args.hidden or 64, steps, args.repeats, args.device, args.seed)
    table = format_table(rows)
    lines = verdict(rows)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(table, file=out)
    print("\n".join(lines), file=out)
    if args.json:
        record = {"command": " ".join(command), "env": env_info(args.device, threads), "rows": rows, "verdicts": lines}
        write_output(args.json, json.dumps(record, indent=1) + "\n")
    return 0
