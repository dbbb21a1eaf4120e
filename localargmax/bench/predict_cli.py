"""``localargmax-bench --predict``: the bandwidth model's table, labelled
PREDICTED everywhere (text, JSON, README).

Per shape and batch, one row per built variant: ``simt`` (the NB its
launcher runs at that batch), every tensor-core variant of the MmaVariant
table (``mma/0`` .. ``mma/20``: 0-3 the register-buffered kernel, 4-15 the
cp.async-pipelined one, 16-20 their TMA twins; the ops run each as
``path="mma/<id>"``) and
``gemm``; then the fastest not-built design point of the model's search space
(``proposed-best``) and the cheapest one that meets the bar
(``proposed-min``: fewest stages, no PDL when possible, smallest split-K).
``role`` marks C++ ``auto``'s choice (``auto``) and the dispatch table's
(``table``). ``--json`` adds a summary
per shape and batch (the README table).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from . import predict as pm
from . import tune
from .report import write_output

LABEL = "PREDICTED (bandwidth model, not measured)"
LEGEND = (
    "PREDICTED, not measured: localargmax.bench.predict's Little's-law model of one call on an {device} "
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
        "built": v.built,
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
    """(rows, summary): every built variant's prediction (simt, each MmaVariant id, gemm) and the
    proposed ones, and per shape and batch the auto / table / proposed figures (the README table)."""
    rows, summary = [], []
    for s in shapes:
        for b in batches:
            auto = tune.incumbent_of(s.rows, b)  # C++ auto (choose_mma_variant sees num_valid)
            chosen = table.choose(spec.arch, "bfloat16", s.hidden, s.padded_rows, b)
            table_path = chosen.op_path if chosen is not None else auto
            got = {}
            for path in ("simt", *(f"mma/{m.id}" for m in pm.MMA_VARIANTS), "gemm"):
                role = [r for r, p in (("auto", auto), ("table", table_path)) if p == path]
                got[path] = prediction_row(spec, s, b, pm.todays_variant(path, b), role, registers)
            best = pm.best(spec, pm.proposed_variants(b), s.rows, s.hidden, b, registers)
            got["proposed-best"] = prediction_row(spec, s, b, best.variant, ["proposed-best"], registers)
            smallest = pm.smallest_meeting_bar(spec, s.rows, s.hidden, b, registers)
            if smallest is not None:
                got["proposed-min"] = prediction_row(spec, s, b, smallest.variant, ["proposed-min"], registers)
            rows += got.values()
            summary.append(
                {
                    "shape": s.model,
                    "tp": s.tp,
                    "rows": s.rows,
                    "hidden": s.hidden,
                    "batch": b,
                    "auto": _brief(got[auto]),
                    "table": _brief(got[table_path]),
                    "proposed_best": _brief(got["proposed-best"]),
                    "proposed_min": _brief(got["proposed-min"]) if smallest is not None else None,
                    "table_meets_bar": got[table_path]["fraction_of_copy"] >= pm.BAR_FRACTION,
                }
            )
    return rows, summary


def _brief(row: dict) -> dict:
    return {
        "variant": row["variant"],
        "short": short_name(row["variant"]),
        "us": row["predicted_us"],
        "of_copy": row["fraction_of_copy"],
    }


def short_name(name: str) -> str:
    """``mma(stages=3,tile_rows=128,split_k=2,...,pdl=1,...)`` -> ``mma S3 R128 K2 +pdl``; today's names as they are."""
    if "stages=" not in name:
        return name
    p = dict(kv.split("=") for kv in name[name.index("(") + 1 : -1].split(","))
    return f"mma S{p['stages']} R{p['tile_rows']} K{p['split_k']}" + (" +pdl" if p.get("pdl") == "1" else "")


def _meets(summary_row: dict) -> bool:
    return summary_row["batch"] > pm.BAR_MAX_BATCH or summary_row["table_meets_bar"]


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
    table_doc = tune.predicted_table(spec, registers, commit="")
    from ..dispatch import DispatchTable

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


def run_predict(args, command: str) -> int:
    """``--predict``: print the table (and write ``--json`` / ``--write-table``)."""
    spec = pm.DEVICES[args.gpu]
    if args.latency_ns is not None:
        spec = pm.with_latency(spec, args.latency_ns * 1e-9)
    registers = pm.read_registers(path=args.registers)
    tps = [int(x) for x in args.tp.split(",")] if args.tp else None
    if args.model not in (None, "minilm", "synthetic"):
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
        "- role: auto = C++ path='auto' (its mma variant by choose_mma_variant); table = the dispatch table's "
        "choice (predicted; path='mma/<id>' for an mma cell); proposed-best / proposed-min = fastest / cheapest "
        "design point of the model's search space (not built: deeper stages, 256-row tiles, fused init) / "
        "meeting the bar",
        file=out,
    )
    missed = [f"{s['shape']} tp{s['tp']} B={s['batch']}" for s in doc["summary"] if not _meets(s)]
    verdict = "met" if not missed else "missed at " + ", ".join(missed)
    print(
        f"- PREDICTED bar (>= {pm.BAR_FRACTION} of copy at batch <= {pm.BAR_MAX_BATCH}), table's choices: {verdict}",
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
