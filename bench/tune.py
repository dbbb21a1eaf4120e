"""Dispatch tables and how they are made (from the repository root):

* ``python -m bench.predict_cli --write-table PATH``: every cell's path from
  the bandwidth model (:mod:`bench.predict`), ``"source": "predicted"``
  (``path="auto"`` never reads one);
* ``python -m bench.tune --write-table PATH`` (GPU): each path timed on the
  engine shapes with CUDA-graph replay (:mod:`localargmax.bench.timing`);
  cells holding an engine shape take the fastest measured path (``"source":
  "measured"``), the others keep the model's choice (their entries say
  ``"predicted"``). ``LOCALARGMAX_DISPATCH_TABLE=PATH`` makes ``path="auto"``
  follow it (:mod:`localargmax.dispatch`).

A table covers, per arch and dtype, every (hidden size, shard rows, batch)
in ``[0, 2**31)`` with buckets (the ``edges``): rows in units of one 128-row
tile per SM, batch at the launchers' own boundaries (simt NB, mma NT). A
cell's samples are the engine shapes that fall in it, else a point in the
middle, at the bucket's lowest and highest batch; its path is the one with
the smallest worst-case slowdown over the samples; C++ ``auto``'s path is
kept unless another is faster by more than :data:`HYSTERESIS` (the model's
resolution). The table is keyed by the shard's *rows* (``weight.shape[0]``,
padding included, equal on every rank), never ``num_valid``: every rank must
take the same path (DESIGN.md, CUDA rules).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from localargmax.dispatch import SCHEMA

from . import predict as pm

TABLE_DTYPES = ("bfloat16", "float16")
LIMIT = 2**31
HYSTERESIS = 1.03
PATHS = ("simt", "mma", "gemm")

Timer = Callable[[str, int, int, int], "float | None"]
"""``timer(path, rows, hidden, batch)`` -> seconds per call, or None (not timed); ``path`` is an
path or config: ``"simt"``, ``"gemm"`` or ``"mma/<name>"`` (:func:`localargmax._validation.op_kwargs`)."""


def candidates(batch: int) -> tuple[str, ...]:
    """The paths a cell can choose at ``batch``: simt, the mma configs of
    C++ auto's summation-order class there
    (:func:`bench.predict.mma_candidates`), gemm."""
    return ("simt", *(f"mma/{i}" for i in pm.mma_candidates(batch)), "gemm")


def timed(batch: int) -> tuple[str, ...]:
    """What ``bench.tune`` times at ``batch``: the :func:`candidates`, then the TMA twins of their
    order class (:func:`bench.predict.mma_tma_twins`, sm_90+): timed and recorded in
    the measurements, never a table's choice (C++ auto takes them itself where the launch can:
    auto_takes_tma; a table's cp.async cell runs the same sums)."""
    return (*candidates(batch), *(f"mma/{i}" for i in pm.mma_tma_twins(batch)))


def _path_and_config(candidate: str) -> tuple[str, str | None]:
    return ("mma", candidate[4:]) if candidate.startswith("mma/") else (candidate, None)


def incumbent_of(rows: int, batch: int, log_partition: bool = False) -> str:
    """C++ ``auto``'s choice on an H200 as a candidate (``rows`` stands for num_valid in
    choose_mma_config): the TMA rows for the plain ops, their cp.async twins (the same bits) with
    the log-partition, which the TMA rows do not carry."""
    path = pm.cpp_auto_path(batch)
    return f"mma/{pm.cpp_mma_config(rows, batch, tma=True, log_partition=log_partition)}" if path == "mma" else path


def bucket_edges(spec: pm.DeviceSpec) -> dict:
    """Bucket edges (``[lo, hi)`` between neighbours) for ``spec``'s arch."""
    per_sm = 128 * spec.sms  # rows of one 128-row mma tile per SM
    return {
        "hidden": [0, 3072, 6144, LIMIT],
        "rows": [0, per_sm // 2, per_sm, 2 * per_sm, 4 * per_sm, 8 * per_sm, LIMIT],
        "batch": [0, 2, 3, 5, 9, 17, 33, 65, 129, 257, 1025, LIMIT],
    }


def _ranges(edges: list[int]) -> list[tuple[int, int]]:
    return list(zip(edges[:-1], edges[1:]))


def model_samples(rng_h, rng_r, shapes: list[pm.EngineShape]) -> list[tuple[int, int]]:
    """(rows, hidden) samples of a cell: the engine shapes in it, else its middle."""
    inside = [(s.padded_rows, s.hidden) for s in shapes if _in(s.padded_rows, rng_r) and _in(s.hidden, rng_h)]
    if inside:
        return sorted(set(inside))
    return [(_middle(*rng_r, floor=1024), _middle(*rng_h, floor=1024, top=8192))]


def _middle(lo: int, hi: int, floor: int, top: int = 262144) -> int:
    lo, hi = max(lo, floor), min(hi, top)
    return max(lo, int(math.sqrt(lo * hi)) // 64 * 64)


def batch_samples(rng_b) -> list[int]:
    lo, hi = rng_b
    return sorted({max(lo, 1), min(hi - 1, 4096)})


def _in(x: int, rng) -> bool:
    return rng[0] <= x < rng[1]


def choose_cell(samples, batches, timer: Timer, incumbent: str):
    """(candidate, worst-case slowdown, {candidate: seconds at the first sample}) for one cell: the
    candidate (:func:`candidates`) with the smallest worst slowdown over the samples; the
    incumbent (C++ auto's) unless another beats it by more than :data:`HYSTERESIS`."""
    options = candidates(batches[0])
    worst = {p: 1.0 for p in options}
    first = {}
    for rows, hidden in samples:
        for b in batches:
            times = {p: timer(p, rows, hidden, b) for p in options}
            times = {p: t for p, t in times.items() if t is not None}
            if not first:
                first = dict(times, batch=b, rows=rows, hidden=hidden)
            fastest = min(times.values())
            for p in options:
                worst[p] = max(worst[p], times[p] / fastest) if p in times else math.inf
    best = min(options, key=lambda p: worst[p])
    if incumbent in worst and worst[incumbent] <= worst[best] * HYSTERESIS:
        best = incumbent
    return best, worst[best], first


def build_table(
    spec: pm.DeviceSpec,
    timer: Timer,
    source: str,
    shapes: list[pm.EngineShape],
    measured_cell: Callable | None = None,
    meta: dict | None = None,
) -> dict:
    """The table document. ``timer`` decides every cell; with
    ``measured_cell(rng_h, rng_r, rng_b) -> ([(rows, hidden)], [batch]) or
    None`` a cell with timed samples is decided on them and marked measured
    (``bench.tune``). A cell's batches all lie on one side of batch 32, so its
    candidates (:func:`candidates`) are those of its lowest batch."""
    edges = bucket_edges(spec)
    entries = []
    for rng_h in _ranges(edges["hidden"]):
        for rng_r in _ranges(edges["rows"]):
            for rng_b in _ranges(edges["batch"]):
                batches = batch_samples(rng_b)
                found = measured_cell(rng_h, rng_r, rng_b) if measured_cell else None
                cell_source = "measured" if found else "predicted"
                samples, batches = found if found else (model_samples(rng_h, rng_r, shapes), batches)
                incumbent = incumbent_of(samples[0][0], batches[0])
                chosen, worst, at = choose_cell(samples, batches, timer, incumbent)
                path, config = _path_and_config(chosen)
                entries.append(
                    {
                        "hidden": list(rng_h),
                        "rows": list(rng_r),
                        "batch": list(rng_b),
                        "path": path,
                        "config": config,
                        "source": cell_source,
                        "at": {"rows": at["rows"], "hidden": at["hidden"], "batch": at["batch"]},
                        "us": {p: round(at[p] * 1e6, 1) for p in candidates(batches[0]) if p in at},
                        "worst_slowdown": round(worst, 3),
                    }
                )
    return {
        "schema": SCHEMA,
        "source": source,
        "label": "PREDICTED (bandwidth model, no GPU)" if source == "predicted" else "MEASURED",
        **(meta or {}),
        "tables": [{"arch": spec.arch, "dtypes": list(TABLE_DTYPES), "edges": edges, "entries": entries}],
    }


def model_timer(spec: pm.DeviceSpec, registers: pm.Registers) -> Timer:
    def timer(path, rows, hidden, batch):
        v = pm.todays_variant(path, batch, num_valid=rows, sms=spec.sms)
        return pm.predict(spec, v, rows, hidden, batch, registers=registers).time_s

    return timer


def registers_of_table(doc: dict) -> pm.Registers:
    """The registers a table was made with (so that regenerating it is exact)."""
    return pm.Registers(dict(doc["registers"]), doc["registers_source"])


def predicted_table(spec: pm.DeviceSpec, registers: pm.Registers, commit: str | None = None) -> dict:
    """The model's table (``python -m bench.predict_cli --write-table``)."""
    meta = _meta(spec, registers, commit, "python -m bench.predict_cli --write-table")
    return build_table(spec, model_timer(spec, registers), "predicted", pm.engine_shapes(), meta=meta)


def _meta(spec, registers, commit, generated_by) -> dict:
    return {
        "generated_by": generated_by,
        "model": {"module": "bench.predict", "version": pm.MODEL_VERSION},
        "device": spec.name,
        "commit": commit if commit is not None else git_commit(),
        "registers_source": registers.source,
        "registers": dict(sorted(registers.by_variant.items())),
        "note": "keys: arch, dtype, hidden size, shard rows (weight.shape[0], padding included: equal on every "
        "rank), batch; each range is [lo, hi). path 'mma' names its config (csrc/cuda/mma_configs.h; only "
        "configs of C++ auto's summation-order class at that batch); simt and gemm size themselves by the "
        "batch (config null).",
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dumps(doc: dict) -> str:
    """The table as text: header fields indented, one entry per line."""
    head = {k: v for k, v in doc.items() if k != "tables"}
    lines = json.dumps(head, indent=2).splitlines()[:-1]
    lines[-1] += ","
    lines.append('  "tables": [')
    for i, t in enumerate(doc["tables"]):
        lines.append("    {")
        for k in ("arch", "dtypes", "edges"):
            lines.append(f"      {json.dumps(k)}: {json.dumps(t[k])},")
        lines.append('      "entries": [')
        lines += [
            f"        {json.dumps(e)}" + ("," if j < len(t["entries"]) - 1 else "") for j, e in enumerate(t["entries"])
        ]
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(doc["tables"]) - 1 else ""))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def write_table(doc: dict, path: str | Path) -> None:
    from localargmax.bench.report import write_output
    from localargmax.dispatch import validate

    validate(doc)
    write_output(path, dumps(doc))


# --- the GPU tune -----------------------------------------------------------------------------------------------

TUNE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
SIMT_MAX_BATCH = 8  # simt is issue-bound past it (ms per call at tp 1): not timed


def tune(
    spec: pm.DeviceSpec,
    timer: Timer,
    registers: pm.Registers,
    shapes: list[pm.EngineShape] | None = None,
    batches=TUNE_BATCHES,
    device_name: str = "",
    commit: str | None = None,
    progress=None,
    seconds: float | None = None,
    clock=None,
    checkpoint=None,
    on_error=None,
    skip: set | frozenset = frozenset(),
) -> dict:
    """Time every candidate (path and mma config, :func:`candidates`) on
    ``shapes`` x ``batches`` with ``timer`` (the GPU's, or a fake one in
    tests) and build the measured table: cells with an engine shape and a
    timed batch are decided by the timings, the rest by the model.

    Shapes go smallest shard first (cheap timings; the tp-8 cells). With
    ``seconds``, timing stops before the first (shape, batch) that starts
    past that many seconds (``clock``: ``time.monotonic``); the cells not
    reached keep the model's choice, and ``doc["tune_cut"]`` says where it
    stopped.

    A candidate whose timing raises is recorded with its error (its row in
    ``doc["measurements"]`` has ``"error"``; it takes no cell) and the tune
    goes on: ``on_error()`` runs first (the GPU run synchronises there).
    ``checkpoint(doc)``, if given, gets the table built from what has been
    timed so far after every (shape, batch), so a run that dies later still
    leaves a table. Paths in ``skip`` (configs that failed a first call) are
    not timed; their rows say so."""
    import time

    clock = clock or time.monotonic
    start = clock()
    shapes = sorted(pm.engine_shapes() if shapes is None else shapes, key=lambda s: (s.padded_rows, s.hidden))
    measured: dict = {}
    errors: dict = {}
    cut = None
    for s in shapes:
        for b in batches:
            if cut is None and seconds is not None and clock() - start > seconds:
                cut = f"{s.label} B={b}: {seconds:g} s spent"
            if cut is not None:
                continue
            for p in timed(b):
                if p == "simt" and b > SIMT_MAX_BATCH:
                    continue
                if progress:
                    progress(f"tune {s.label} rows={s.padded_rows} H={s.hidden} B={b} {p} ...")
                key = (p, s.padded_rows, s.hidden, b)
                if p in skip:
                    measured[key], errors[key] = None, "skipped: failed its first call (--skip)"
                    continue
                try:
                    measured[key] = timer(p, s.padded_rows, s.hidden, b)
                except Exception as e:  # noqa: BLE001 (recorded; the tune goes on)
                    measured[key], errors[key] = None, f"{type(e).__name__}: {e}"[:500]
                    if progress:
                        progress(f"tune {s.label} B={b} {p}: {errors[key]}")
                    if on_error:
                        on_error()
            if checkpoint:
                checkpoint(_tune_doc(spec, registers, commit, device_name, measured, errors, cut))
    return _tune_doc(spec, registers, commit, device_name, measured, errors, cut)


def _tune_doc(spec, registers, commit, device_name, measured: dict, errors: dict, cut) -> dict:
    """The measured table from the timings so far (``None``: not timed or failed)."""
    model = model_timer(spec, registers)

    def merged(path, rows, hidden, batch):
        key = (path, rows, hidden, batch)
        if any(k[1:] == key[1:] for k in measured):
            return measured.get(key)
        return model(path, rows, hidden, batch)

    timed_points = {k[1:] for k in measured}

    def measured_cell(rng_h, rng_r, rng_b):
        timed = sorted({b for r, h, b in timed_points if _in(b, rng_b) and _in(r, rng_r) and _in(h, rng_h)})
        inside = sorted({(r, h) for r, h, b in timed_points if _in(b, rng_b) and _in(r, rng_r) and _in(h, rng_h)})
        # (each cell holds at most one engine shape and one tune batch: a cut leaves it whole or untimed)
        return (inside, timed) if inside and timed else None

    meta = _meta(spec, registers, commit, "python -m bench.tune")
    meta["measured_on"] = device_name
    # cells without a timed shape are decided as in the predicted table (same samples)
    doc = build_table(spec, merged, "measured", pm.engine_shapes(), measured_cell=measured_cell, meta=meta)
    doc["tune_cut"] = cut
    doc["measurements"] = [
        {
            **dict(zip(("path", "config"), _path_and_config(p))),
            "rows": r,
            "hidden": h,
            "batch": b,
            "us": None if t is None else round(t * 1e6, 2),
            **({"error": errors[(p, r, h, b)]} if (p, r, h, b) in errors else {}),
        }
        for (p, r, h, b), t in sorted(measured.items())
    ]
    return doc


def cuda_timer(steps: int = 60, warmup: int = 5, budget_s: float = 2.0) -> Timer:
    """Seconds per ``shard_argmax(hidden, weight, **op_kwargs(path))`` call (``path``:
    ``"simt"``, ``"gemm"`` or ``"mma/<name>"``) on the current GPU (bf16,
    N(0, 1/H) weights, two rotating copies), by CUDA-graph replay
    (:func:`localargmax.bench.timing.time_cuda`); the median sample."""
    import torch

    from localargmax import shard_argmax
    from localargmax._validation import op_kwargs
    from localargmax.bench.timing import time_cuda

    cache: dict = {}

    def timer(path, rows, hidden, batch):
        if (rows, hidden) not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            w = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) / math.sqrt(hidden)
            cache[(rows, hidden)] = [w, w.clone()]
        h = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)
        times, _ = time_cuda(
            lambda w: shard_argmax(h, w, **op_kwargs(path)), cache[(rows, hidden)], steps, warmup, budget_s
        )
        return statistics.median(times)

    return timer


def run_tune(
    table_path: str, json_path: str | None, command: str, seconds: float | None = None, skip=frozenset()
) -> int:
    """Exit 2 without a usable GPU, else time (for at most ``seconds`` when given), write the table
    (and the timings as JSON)."""
    import torch

    from localargmax import WITH_CUDA

    if not torch.cuda.is_available() or not WITH_CUDA:
        why = "no CUDA device" if not torch.cuda.is_available() else "this build of localargmax has no CUDA kernels"
        print(
            f"python -m bench.tune: needs a GPU and a CUDA build ({why}). On this machine "
            "python -m bench.predict_cli --write-table PATH writes the model's table.",
            file=sys.stderr,
        )
        return 2
    major, minor = torch.cuda.get_device_capability()
    spec = pm.DEVICES["H200"]
    if f"sm_{major}{minor}" != spec.arch:
        print(f"bench.tune: device is sm_{major}{minor}; the table's buckets use the {spec.name} spec", file=sys.stderr)
        spec = dataclasses.replace(
            spec, arch=f"sm_{major}{minor}", sms=torch.cuda.get_device_properties(0).multi_processor_count
        )
    registers = pm.read_registers()

    def recover():  # a failed launch: let the device settle before the next candidate
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (a sticky error: later candidates fail and are recorded too)
            print(f"bench.tune: synchronize after a failed candidate: {e}", file=sys.stderr)

    def checkpoint(partial):
        partial["command"] = command
        write_table(partial, table_path)

    doc = tune(
        spec,
        cuda_timer(),
        registers,
        device_name=torch.cuda.get_device_name(),
        progress=lambda m: print(m, file=sys.stderr),
        seconds=seconds,
        checkpoint=checkpoint,
        on_error=recover,
        skip=skip,
    )
    if doc["tune_cut"]:
        print(f"bench.tune: stopped timing at {doc['tune_cut']}; later cells keep the model's choice", file=sys.stderr)
    doc["command"] = command
    write_table(doc, table_path)
    print(
        f"wrote the measured dispatch table to {table_path}; LOCALARGMAX_DISPATCH_TABLE={table_path} makes "
        "path='auto' follow it",
        file=sys.stderr,
    )
    if json_path:
        text = json.dumps({"tune_cut": doc["tune_cut"], "measurements": doc["measurements"]}, indent=1)
        from localargmax.bench.report import write_output

        write_output(json_path, text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.tune``: 0 ok, 2 no GPU / CUDA build or bad options."""
    import argparse
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="python -m bench.tune",
        description="GPU: time simt, gemm and each mma config a cell may take (csrc/cuda/mma_configs.h) on the engine "
        "shapes, smallest shard first, with CUDA-graph replay, and write the measured dispatch table (cells "
        "without an engine shape, or not reached within --seconds, keep the bandwidth model's choice). "
        "LOCALARGMAX_DISPATCH_TABLE=PATH then makes path='auto' follow it.",
    )
    p.add_argument("--write-table", metavar="PATH", required=True, help="where the measured table goes")
    p.add_argument("--json", metavar="PATH", help="also write every timing (and error) as JSON")
    p.add_argument("--seconds", type=float, help="stop timing after this many seconds")
    p.add_argument("--skip", metavar="PATHS", help="comma-separated paths not to time (configs that failed a call)")
    args = p.parse_args(argv)
    if args.seconds is not None and not (math.isfinite(args.seconds) and args.seconds > 0):
        p.error(f"--seconds must be > 0, got {args.seconds}")
    skip = {x.strip() for x in (args.skip or "").split(",") if x.strip()}
    try:
        command = shlex.join(["python", "-m", "bench.tune", *argv])
        return run_tune(args.write_table, args.json, command, args.seconds, skip)
    except (ValueError, OSError) as exc:
        print(f"python -m bench.tune: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
