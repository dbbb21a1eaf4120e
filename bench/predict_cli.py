"""``python -m bench.predict_cli`` (from the repository root): the bandwidth
model's table of the CUDA paths, labelled PREDICTED everywhere (text, JSON,
bench/README.md). No GPU needed.

Per shape and batch, one row per built variant: ``simt`` (the NB its
launcher runs at that batch), every config of the tensor-core kernel
(``mma/<name>``, csrc/cuda/mma_configs.h) and ``gemm``. ``role`` marks
C++ ``auto``'s choice (``auto``) and the model's own choice (``model``: what
a table written with ``--write-table`` names; ``path="auto"`` follows C++'s
choice unless a measured table is set, see localargmax.dispatch). ``--json``
adds a summary per shape and batch (bench/README.md's table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from localargmax.bench.report import write_output

from . import predict as pm
from . import tune

LABEL = "PREDICTED (bandwidth model, not measured)"
LEGEND = (
    "PREDICTED, not measured: bench/predict.py's Little's-law model of one call on an {device} "
    "({sms} SMs, copy {copy:.2f} TB/s, read stream {stream:.2f} TB/s, latency {lat:.0f} ns, range {lo:.0f}-{hi:.0f} ns "
    "in the JSON). of_copy = shard weight bytes / time / copy bandwidth; bar = {bar} of copy at batch <= {bar_b}. "
    "Registers: {regs}."
)


def prediction_row(spec, shape: pm.EngineShape, batch: int, v: pm.Variant, role: list, registers) -> dict:
    p = pm.predict(spec, v, shape.rows, shape.hidden, batch, registers=registers)
    lo, hi = (
        pm.predict(spec, v, shape.rows, shape.hidden, batch, registers=registers, latency_s=lat)
        for lat in spec.latency_range_s
    )
    return {
        "label": "PREDICTED",
        "shape": shape.model,
        "tp": shape.tp,
        "rows": shape.rows,
        "padded_rows": shape.padded_rows,
        "hidden": shape.hidden,
        "batch": batch,
        "variant": v.name,
        "path": v.path,
        "role": role,
        "predicted_us": round(p.us, 2),
        "predicted_us_range": [round(lo.us, 2), round(hi.us, 2)],
        "fraction_of_copy": round(p.fraction_of_copy, 4),
        "fraction_of_copy_range": [round(hi.fraction_of_copy, 4), round(lo.fraction_of_copy, 4)],
        "bound": p.bound,
        "ctas": p.ctas if v.path != "gemm" else None,
        "ctas_per_sm": p.ctas_per_sm if v.path != "gemm" else None,
        "rounds": p.rounds,
        "regs": p.regs,
        "in_flight_per_sm_kib": round(p.in_flight_per_sm / 1024, 1) if v.path != "gemm" else None,
        "little_per_sm_kib": round(p.little_per_sm / 1024, 1),
    }


def predicted_rows(spec, shapes, batches, registers, table) -> tuple[list[dict], list[dict]]:
    """(rows, summary): every built variant's prediction (simt, each mma config, gemm), and per
    shape and batch the figures of C++ auto's and the model's choices (bench/README.md's table)."""
    rows, summary = [], []
    for s in shapes:
        for b in batches:
            auto = tune.incumbent_of(s.rows, b)  # C++ auto (choose_mma_config sees num_valid)
            chosen = table.choose(spec.arch, "bfloat16", s.hidden, s.padded_rows, b)
            table_path = chosen.op_path if chosen is not None else auto
            got = {}
            for path in ("simt", *(f"mma/{name}" for name in pm.MMA_CONFIGS), "gemm"):
                role = [r for r, p in (("auto", auto), ("model", table_path)) if p == path]
                got[path] = prediction_row(spec, s, b, pm.todays_variant(path, b), role, registers)
            rows += got.values()
            summary.append(
                {
                    "shape": s.model,
                    "tp": s.tp,
                    "rows": s.rows,
                    "hidden": s.hidden,
                    "batch": b,
                    "auto": _brief(got[auto]),
                    "model": _brief(got[table_path]),
                    "model_meets_bar": got[table_path]["fraction_of_copy"] >= pm.BAR_FRACTION,
                    # the *_lse ops (log-probs, log-odds): C++ auto's path, and the plain op's config
                    # or its cp.async twin (the TMA rows carry no log-partition); before the tensor
                    # cores took them: simt
                    "log_partition": _brief(got[tune.incumbent_of(s.rows, b, log_partition=True)]),
                    "log_partition_before": _brief(got["gemm" if auto == "gemm" else "simt"]),
                }
            )
    return rows, summary


def _brief(row: dict) -> dict:
    return {"variant": row["variant"], "us": row["predicted_us"], "of_copy": row["fraction_of_copy"]}


def _meets(summary_row: dict) -> bool:
    return summary_row["batch"] > pm.BAR_MAX_BATCH or summary_row["model_meets_bar"]


def legend(spec, registers) -> str:
    lo, hi = spec.latency_range_s
    return LEGEND.format(
        device=spec.name,
        sms=spec.sms,
        copy=spec.copy_Bps / 1e12,
        stream=spec.stream_Bps / 1e12,
        lat=spec.latency_s * 1e9,
        lo=lo * 1e9,
        hi=hi * 1e9,
        bar=pm.BAR_FRACTION,
        bar_b=pm.BAR_MAX_BATCH,
        regs=registers.source,
    )


COLUMNS = (
    ("shape", "shape"),
    ("tp", "tp"),
    ("batch", "batch"),
    ("variant", "variant"),
    ("role", "role"),
    ("predicted_us", "pred_us"),
    ("fraction_of_copy", "of_copy"),
    ("bound", "bound"),
    ("in_flight_per_sm_kib", "KiB/SM"),
    ("ctas_per_sm", "CTA/SM"),
    ("regs", "regs"),
)


def format_rows(rows: list[dict]) -> str:
    cells = [[title for _, title in COLUMNS]]
    for r in rows:
        cells.append([",".join(r[k]) if k == "role" else "-" if r[k] is None else str(r[k]) for k, _ in COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(c))).rstrip() for c in cells)


def predicted_doc(spec, shapes, batches, registers, command: str) -> dict:
    from localargmax.dispatch import DispatchTable

    table_doc = tune.predicted_table(spec, registers, commit="")

    rows, summary = predicted_rows(spec, shapes, batches, registers, DispatchTable(table_doc))
    return {
        "kind": "predicted",
        "label": LABEL,
        "legend": legend(spec, registers),
        "command": command,
        "model": table_doc["model"],
        "device": {k: v for k, v in dataclasses.asdict(spec).items() if k != "sources"},
        "sources": spec.sources,
        "registers_source": registers.source,
        "registers": dict(sorted(registers.by_variant.items())),
        "bar": {"fraction_of_copy": pm.BAR_FRACTION, "max_batch": pm.BAR_MAX_BATCH},
        "rows": rows,
        "summary": summary,
    }, table_doc


def dumps(doc: dict) -> str:
    """The JSON document as text: header fields indented, one row per line."""
    head = json.dumps({k: v for k, v in doc.items() if k not in ("rows", "summary")}, indent=1)[:-2]
    parts = [head + ","]
    for key in ("rows", "summary"):
        body = ",\n".join("  " + json.dumps(r) for r in doc[key])
        parts.append(f' "{key}": [\n{body}\n ]' + ("," if key == "rows" else ""))
    return "\n".join(parts) + "\n}\n"


EXAMPLES = """\
examples (from the repository root):
  python -m bench.predict_cli                                  # every engine shape, batches 1..256
  python -m bench.predict_cli --model qwen3 --tp 1,8 --batch 1,64 --latency-ns 800
  python -m bench.predict_cli --json bench/results/predicted_h200.json   # bench/README.md's table
  python -m bench.predict_cli --write-table /tmp/predicted.json          # the model's dispatch table
  python -m bench.predict_cli --target-sampling --model qwen3 --tp 2,8 --batch 1,16,64 \
      --json bench/results/predicted_target_sampling_h200.json  # the target's sampling step per method
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.predict_cli",
        description="PREDICTED times of one shard_argmax call per CUDA path and mma variant on an H200, from "
        "a Little's-law bandwidth model (bench/predict.py; docs/model.md). No GPU needed. Registers come from "
        "the built .so (cuobjdump), else the build log, else the defaults of bench/predict.py (it says which).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", choices=sorted(pm.PRESET_SHAPES), help="one model's shards (default: the engine shapes)")
    p.add_argument("--tp", help="--model: comma-separated TP sizes, rank 0's shard (default 1)")
    p.add_argument("--batch", help="comma-separated batch sizes (default 1,2,4,...,256)")
    p.add_argument("--json", metavar="PATH", help="write the rows and the summary as JSON ('-' = stdout)")
    p.add_argument(
        "--write-table",
        metavar="PATH",
        help="also write the model's dispatch table (source 'predicted'; path='auto' never reads one)",
    )
    p.add_argument("--gpu", default="H200", choices=sorted(pm.DEVICES), help="the device spec (default H200)")
    p.add_argument("--latency-ns", type=float, help="memory latency in ns (default: the spec's)")
    p.add_argument("--registers", metavar="FILE", help="registers from this cuobjdump dump or build log")
    p.add_argument(
        "--target-sampling",
        action="store_true",
        help="instead: one rank's target sampling step (temperature rows, vLLM's noise) per method: vLLM's "
        "full gather, vLLM 0.34's batch-sharded all-to-all, the fused step (bench/predict.py, "
        "predict_target_sampling); with --model, --tp (default 2,4,8) and --batch (default 1,16,64)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, print the table; 0 ok, 2 bad options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for name in ("tp", "batch"):
            text = getattr(args, name)
            if text is not None and (not text.replace(",", "").isdigit() or min(int(x) for x in text.split(",")) < 1):
                parser.error(f"--{name} must be comma-separated integers >= 1, got {text!r}")
        if args.tp and not args.model and not args.target_sampling:
            parser.error("--tp goes with --model")
        if args.latency_ns is not None and not args.latency_ns > 0:
            parser.error(f"--latency-ns must be > 0, got {args.latency_ns}")
        if args.target_sampling and args.write_table:
            parser.error("--write-table goes without --target-sampling")
        command = shlex.join(["python", "-m", "bench.predict_cli", *argv])
        return run_target(args, command) if args.target_sampling else run_predict(args, command)
    except (ValueError, KeyError, OSError) as exc:
        print(f"python -m bench.predict_cli: error: {exc}", file=sys.stderr)
        return 2


TARGET_COLUMNS = (("model", "model"), ("tp", "tp"), ("batch", "batch"), ("method", "method"),
                  ("us", "PREDICTED us"), ("vs_gather", "vs full-gather"), ("sent_bytes", "sent_B"),
                  ("recv_bytes", "recv_B"), ("logits_us", "logits us"), ("exchange_us", "exchange us"),
                  ("sample_us", "sample us"))  # fmt: skip


def target_doc(spec, shapes, batches, command: str) -> dict:
    """``--target-sampling``'s JSON: rows per (shape, batch, method), PREDICTED."""
    rows = []
    for shape in shapes:
        for batch in batches:
            preds = pm.predict_target_sampling(spec, shape, batch)
            gather = preds[0].time_s
            for p in preds:
                row = {"model": p.model, "tp": p.tp, "batch": p.batch, "method": p.method, "us": round(p.us, 1)}
                row |= {"vs_gather": round(gather / p.time_s, 3), "sent_bytes": p.sent_bytes}
                row |= {"recv_bytes": p.recv_bytes} | {f"{k}_us": round(v * 1e6, 1) for k, v in p.terms.items()}
                rows.append(row)
    return {
        "kind": "predicted_target",
        "label": LABEL,
        "command": command,
        "model": {"module": "bench/predict.py", "version": pm.MODEL_VERSION},
        "device": {k: v for k, v in dataclasses.asdict(spec).items() if k != "sources"},
        "sources": spec.sources,
        "assumed": {"noise_instructions": pm.NOISE_INSTRUCTIONS, "sampler_bytes": pm.SAMPLER_BYTES},
        "rows": rows,
    }


def run_target(args, command: str) -> int:
    """``--target-sampling``: print the table (and write ``--json``)."""
    spec = pm.DEVICES[args.gpu]
    if args.latency_ns is not None:
        spec = pm.with_latency(spec, args.latency_ns * 1e-9)
    tps = [int(x) for x in args.tp.split(",")] if args.tp else [2, 4, 8]
    shapes = pm.engine_shapes([(m, tp) for m in ([args.model] if args.model else ["qwen3"]) for tp in tps])
    batches = [int(x) for x in args.batch.split(",")] if args.batch else [1, 16, 64]
    doc = target_doc(spec, shapes, batches, command)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"== {LABEL}: {spec.name}, one rank's target sampling step ==", file=out)
    cells = [[t for _, t in TARGET_COLUMNS]] + [[str(r[k]) for k, _ in TARGET_COLUMNS] for r in doc["rows"]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TARGET_COLUMNS))]
    print("\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(c))).rstrip() for c in cells), file=out)
    print("- temperature-only rows, vLLM's noise; fused = the CUDA gemm path (noise= runs there); every figure "
          "PREDICTED (bench/predict.py: link and collective constants ASSUMED, with their sources in the JSON)",
          file=out)  # fmt: skip
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    return 0


def run_predict(args, command: str) -> int:
    """Print the table (and write ``--json`` / ``--write-table``)."""
    spec = pm.DEVICES[args.gpu]
    if args.latency_ns is not None:
        spec = pm.with_latency(spec, args.latency_ns * 1e-9)
    registers = pm.read_registers(path=args.registers)
    tps = [int(x) for x in args.tp.split(",")] if args.tp else None
    if args.model is not None:
        shapes = pm.engine_shapes([(args.model, tp) for tp in (tps or [1])])
    else:
        shapes = pm.engine_shapes()
    batches = [int(x) for x in args.batch.split(",")] if args.batch else list(pm.ENGINE_BATCHES)
    doc, table_doc = predicted_doc(spec, shapes, batches, registers, command)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"== {LABEL}: {spec.name} ==", file=out)
    print(format_rows(doc["rows"]), file=out)
    print(f"- {doc['legend']}", file=out)
    print(
        "- role: auto = C++ path='auto' (its mma config by choose_mma_config); model = the model's choice "
        "(path='auto' runs C++'s choice unless a measured table is set)",
        file=out,
    )
    missed = [f"{s['shape']} tp{s['tp']} B={s['batch']}" for s in doc["summary"] if not _meets(s)]
    verdict = "met" if not missed else "missed at " + ", ".join(missed)
    print(
        f"- PREDICTED bar (>= {pm.BAR_FRACTION} of copy at batch <= {pm.BAR_MAX_BATCH}), "
        f"the model's choices: {verdict}",
        file=out,
    )
    if args.json:
        text = dumps(doc)
        write_output(args.json, text)
    if args.write_table:
        table_doc["commit"] = tune.git_commit()
        tune.write_table(table_doc, args.write_table)
        print(f"wrote the PREDICTED dispatch table to {args.write_table}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
