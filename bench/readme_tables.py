"""Render the measured and predicted tables of README.md and bench/README.md
from the committed bench/results/*.json.

Each generated table sits between two marker comments that name
the JSON files it is made from (a glob under bench/results/):

    <!-- results: cpu_minilm_default.*.json -->
    ...generated, do not edit...
    <!-- /results -->

Benchmark files (written by ``localargmax-bench --json``) become a table with
the columns, rows and units the CLI prints, followed by the CLI's legend and a
note naming the files, the command that wrote them and the machine. When the
glob matches several runs of one command, each cell shows the median over the
runs and, where the runs differ, their range: ``1.30 (1.17–1.59)``. A file
whose rows hold ``what, command, seconds, build_seconds, loadavg`` (timed
install commands, bench/results/install_times.json) becomes a table of those.

    python bench/readme_tables.py           # check: exit 1 and a diff if a file is stale
    python bench/readme_tables.py --write   # rewrite the tables in both files
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's localargmax (its table format and legend)
from localargmax.bench.report import cell_value, format_cell, format_legend, table_columns  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"(<!-- results: (?P<glob>\S+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)
# Columns whose value is a measurement that differs between runs of one command.
# The other columns (method, shape, batch, bytes, ...) identify a row.
MEASURED = {
    "median_us",
    "p90_us",
    "speedup_vs_full_gather",
    "agree",
    "tp_invariance",
    "gbps",
    "fraction_of_stream",
    "speedup_vs_torch",
}


def load(pattern: str) -> list:
    """The JSON documents matching ``pattern`` under bench/results/, with their paths."""
    paths = sorted(glob.glob(str(RESULTS / pattern)))
    if not paths:
        raise SystemExit(f"readme_tables: no file matches bench/results/{pattern}")
    docs = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        doc["path"] = str(Path(path).relative_to(ROOT))
        docs.append(doc)
    return docs


def _measured(key) -> bool:
    return isinstance(key, str) and (
        key in MEASURED or key.startswith(("speedup_vs_", "fraction_of_")) or key == "tflops"
    )


def _key(row: dict, columns) -> tuple:
    return tuple(cell_value(row, key) for key, _ in columns if not _measured(key))


def _cell(values: list) -> str:
    """One cell: the CLI's format of the median over runs, plus the range when runs differ."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    if len(set(present)) == 1 or not isinstance(present[0], (int, float)):
        return format_cell(present[0])
    mid = statistics.median_low(present) if isinstance(present[0], int) else statistics.median(present)
    return f"{format_cell(mid)} ({format_cell(min(present))}–{format_cell(max(present))})"


def bench_table(docs: list) -> str:
    """A benchmark table: the CLI's columns and rows, one cell per run set."""
    kernel_only = any("fraction_of_stream" in r for r in docs[0]["rows"])
    columns = table_columns(docs[0]["rows"], kernel_only)
    keys = [_key(r, columns) for r in docs[0]["rows"]]
    runs = []
    for doc in docs:
        by_key = {_key(r, columns): r for r in doc["rows"]}
        if sorted(by_key, key=str) != sorted(keys, key=str):
            raise SystemExit(f"readme_tables: {doc['path']} has other rows than {docs[0]['path']}")
        runs.append(by_key)
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for k in keys:
        lines.append("| " + " | ".join(_cell([cell_value(run[k], key) for run in runs]) for key, _ in columns) + " |")
    lines.append("")
    lines += [f"- {line}" for line in format_legend(docs[0]["rows"], kernel_only).splitlines()]
    lines.append("")
    lines.append(_provenance(docs))
    return "\n".join(lines)


def _provenance(docs: list) -> str:
    env = docs[0]["env"]
    files = ", ".join(f"`{d['path']}`" for d in docs)
    # The runs of one command differ only in their --json file: show it once.
    commands = sorted({d["command"].replace(d["path"], "FILE") for d in docs})
    command = "; ".join(f"`{c}`" for c in commands)
    if len(docs) == 1:
        what = f"From {files}, written by `{docs[0]['command']}`."
    else:
        what = (
            f"From {len(docs)} runs ({files}), each written by {command} with FILE its file name; a cell "
            f"shows the median over the runs, then (lowest–highest) where they differ."
        )
    loads = ", ".join(str(d["env"].get("loadavg", ["?"])[0]) for d in docs)
    isa = ""
    if env.get("cpu_features"):  # runs recorded since the ISA record: what the CPU has and the path auto took
        has = ", ".join(f for f, v in env["cpu_features"].items() if v) or "none"
        lacks = ", ".join(f for f, v in env["cpu_features"].items() if not v) or "none"
        by_dtype = env.get("cpu_path_auto_by_dtype") or {}
        auto = env.get("cpu_path_auto", "?")
        if len(set(by_dtype.values())) > 1:  # auto picks per dtype (brgemm where native): name each
            auto = ", ".join(f"{dtype} {path}" for dtype, path in by_dtype.items())
        isa = f" (has {has}; lacks {lacks}; CPU path auto: {auto})"
    return (
        f"{what} Times are one machine's: {env['cpu']}{isa}, {env['cpu_count']} CPUs, torch {env['torch']}, "
        f"{env['threads_per_rank']} thread(s) per rank; 1-minute load average at the end of the "
        f"run{'s' if len(docs) > 1 else ''}: {loads}."
    )


def install_table(docs: list) -> str:
    """A table of measured install times (rows: what, command, seconds, build_seconds, loadavg)."""
    lines = [
        "| install | total | of it, compiling localargmax | 1-minute load average at the end | measured |",
        "|---|---|---|---|---|",
    ]
    for doc in docs:
        for row in doc["rows"]:
            lines.append(
                f"| {row['what']} | {_minutes(row['seconds'])} | {_minutes(row['build_seconds'])} | {row['loadavg']} "
                f"| {row.get('measured', 'before 2026-12')} |"
            )
    env = docs[0]["env"]
    files = ", ".join(f"`{d['path']}`" for d in docs)
    lines += [
        "",
        f"From {files}: the install commands above, each timed in a new clone "
        f"({docs[0]['command']}). One machine's times: {env['cpu']}, {env['cpu_count']} CPUs, "
        f"Python {env['python']}; {env['note']}.",
    ]
    return "\n".join(lines)


def predicted_table(docs: list) -> str:
    """The bandwidth model's table (``python -m bench.predict_cli --json``): per
    shape and batch, C++ auto's choice and the model's, every figure PREDICTED."""
    doc = docs[0]
    lines = [
        "| shape | tp | rows | H | batch | C++ auto (path='auto') | PREDICTED µs | PREDICTED of_copy | "
        "model's choice | µs | of_copy | log-partition ops: auto | of_copy | before: | of_copy |",
        "|" + "---|" * 15,
    ]
    for s in doc["summary"]:
        cells = [s["shape"], s["tp"], s["rows"], s["hidden"], s["batch"]]
        for key in ("auto", "model"):
            cells += [s[key]["variant"], format_cell(s[key]["us"]), format_cell(s[key]["of_copy"])]
        for key in ("log_partition", "log_partition_before"):
            cells += [s[key]["variant"], format_cell(s[key]["of_copy"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        f"- {doc['legend']}",
        "- C++ auto = what path='auto' runs (the mma config choose_mma_config picks below batch 17, then gemm; "
        "mma/<name> = a config of csrc/cuda/mma_configs.h); model's choice = the cell a dispatch table written "
        "by the model would name (path='auto' follows only a measured table)",
        "- log-partition ops = shard_*(log_partition=True), behind return_log_probs and the log-odds: C++ auto "
        "takes the plain op's path and config, or its cp.async twin where the plain op runs a TMA row (the same kernel "
        "and bits, the log-partition a run-time flag; the model "
        "counts no epilogue cost); before = what they ran before the tensor-core epilogue carried the "
        "log-partition (simt below the gemm batch)",
        "",
        f"{doc['label']}: from `{doc['path']}`, written by `{doc['command']}` (model "
        f"{doc['model']['module']} version {doc['model']['version']}). C++ auto's rules are the H200 "
        "measurement's (bench/results/gpu_2026-12-04), not the model's.",
    ]
    return "\n".join(lines)


def predicted_target_table(docs: list) -> str:
    """``python -m bench.predict_cli --target-sampling --json``: one rank's target sampling step per
    method, every figure PREDICTED."""
    doc = docs[0]
    lines = [
        "| model | tp | batch | method | PREDICTED µs | vs full-gather | sent_B | recv_B | logits µs | exchange µs "
        "| sample µs |",
        "|" + "---|" * 11,
    ]
    keys = ("model", "tp", "batch", "method", "us", "vs_gather", "sent_bytes", "recv_bytes", "logits_us")
    for r in doc["rows"]:
        cells = [r[k] for k in keys] + [r["exchange_us"], r["sample_us"]]
        lines.append("| " + " | ".join(format_cell(c) if isinstance(c, float) else str(c) for c in cells) + " |")
    a = doc["assumed"]
    lines += [
        "",
        "- one rank's sampling step of temperature-only rows with vLLM's noise; full-gather = vLLM's default "
        "(all-gather of the logits, the Sampler on [B, V] on every rank); batch-sharded = vLLM 0.34's "
        "enable_batch_sharded_sampling (all-to-all, the Sampler on the rows a rank owns, ids all-gathered); "
        "fused = lm_head_sample(noise=) on the CUDA gemm path (cuBLAS float32 logits of the shard, the keys "
        "kernel with the noise, one key per row exchanged)",
        f"- ASSUMED: collectives {doc['device']['collective_s'] * 1e6:g} µs + bytes received at "
        f"{doc['device']['link_Bps'] / 1e9:g} GB/s; the noise {a['noise_instructions']} lane-instructions per "
        f"logit; vLLM's Sampler {a['sampler_bytes']} bytes per logit (sources in the JSON)",
        "",
        f"{doc['label']}: from `{doc['path']}`, written by `{doc['command']}` (model {doc['model']['module']} "
        f"version {doc['model']['version']}).",
    ]
    return "\n".join(lines)


def compile_table(docs: list) -> str:
    """The tensor-core file's compile, commit beside commit (kind "compile": rows of commit, label,
    mma_kernels, mma_kernels_per_arch, seconds)."""
    lines = ["| build | commit | tensor-core kernels (per arch) | compiling shard_mma.cu |", "|---|---|---|---|"]
    for doc in docs:
        for r in doc["rows"]:
            lines.append(
                f"| {r['label']} | {r['commit']} | {r['mma_kernels']} ({r['mma_kernels_per_arch']}) "
                f"| {_minutes(r['seconds'])} |"
            )
    d, env = docs[0], docs[0]["env"]
    return "\n".join(
        lines
        + [
            "",
            f"From `{d['path']}` ({d['what']}): `{d['command']}`. {env['cpu']}, {env['cpu_count']} CPUs, "
            f"nvcc {env['nvcc']}, {env['measured']}; {env['load']}. Counted by {d['counted_by']}.",
        ]
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def paths_table(docs: list) -> str:
    """The CPU paths side by side (``bench/cpu_paths.py --json``): per dtype, path and batch the
    median time over the runs and its speed against the first path (the runs' median, their range)."""
    cells: dict = {}
    for doc in docs:
        for r in doc["rows"]:
            cells.setdefault((r["dtype"], r["path"], r["batch"]), []).append(r)
    peak = "fraction_of_fma_peak" in docs[0]["rows"][0]  # bench/cpu_paths.py measures the core's FMA peak too
    dp = docs[0]["rows"][0].get("fraction_of_dp_peak") is not None  # and, for bf16, its vdpbf16ps peak
    stream = docs[0]["rows"][0].get("fraction_of_stream") is not None  # and the stream read of the weight
    head = "| dtype | path | batch | median_us | vs first path | keys = first path's |"
    head += " GFLOP/s | of the FMA peak |" if peak else ""
    head += " of the vdpbf16ps peak |" if dp else ""
    head += " GB/s | of the stream read |" if stream else ""
    amx = docs[0]["rows"][0].get("fraction_of_amx_gemm") is not None  # AMX CPUs: of oneDNN's square GEMM
    head += " of the AMX GEMM |" if amx else ""
    lines = [head, "|---" * (6 + 2 * peak + dp + 2 * stream + amx) + "|"]
    for (dtype, path, batch), rows in cells.items():
        us = _cell([r["median_us"] for r in rows]).split(" ")[0]
        extra = ""
        if peak:
            extra = f" {_cell([r['gflops'] for r in rows])} | {_cell([r['fraction_of_fma_peak'] for r in rows])} |"
        if dp:
            extra += f" {_cell([r['fraction_of_dp_peak'] for r in rows])} |"
        if stream:
            extra += f" {_cell([r['gbps'] for r in rows])} | {_cell([r['fraction_of_stream'] for r in rows])} |"
        if amx:
            extra += f" {_cell([r['fraction_of_amx_gemm'] for r in rows])} |"
        lines.append(
            f"| {dtype} | {path} | {batch} | {us} | {_cell([r['speedup_vs_first'] for r in rows])} "
            f"| {'yes' if all(r['keys_equal_first'] for r in rows) else 'no'} |" + extra
        )
    return "\n".join(lines + ["", _provenance(docs)])


def _brgemm_provenance(docs: list) -> str:
    """_provenance, plus the brgemm mode the run recorded (bench/cpu_paths.py's path=brgemm modes)."""
    mode = docs[0]["env"].get("brgemm_mode")
    return _provenance(docs) + (f" brgemm mode: {mode}." if mode else "")


def epilogue_table(docs: list) -> str:
    """``bench/cpu_paths.py --epilogue-share``: per op and batch, path=brgemm with its epilogue and with the
    tiles alone (median and fastest call), and the epilogue's share of the call."""
    d = docs[0]
    lines = [
        "| dtype | rows x H | op | batch | with epilogue (ms) | tiles alone (ms) | epilogue share "
        "| at the fastest calls |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['dtype']} | {r['rows']} x {r['hidden']} | {r['op']} | {r['batch']} "
            f"| {r['with_epilogue_us'] / 1e3:.2f} "
            f"| {r['tiles_only_us'] / 1e3:.2f} | {r['epilogue_share']:.1%} | {r['epilogue_share_at_min']:.1%} |"
            for r in d["rows"]
        ),
    ]
    return "\n".join(lines + ["", _brgemm_provenance(docs)])


def blocks_table(docs: list) -> str:
    """``bench/cpu_paths.py --brgemm-blocks``: per batch, path=brgemm argmax under the rule's block and each
    forced block (median and fastest call), its speed against the rule's, and whether its keys equal the rule's."""
    d = docs[0]
    lines = [
        "| dtype | rows x H | batch | block (M x N x step) | median (ms) | fastest (ms) | vs the rule "
        "| keys = rule's |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['dtype']} | {r['rows']} x {r['hidden']} | {r['batch']} | {r['block']} "
            f"| {r['median_us'] / 1e3:.2f} | {r['min_us'] / 1e3:.2f} | {r['speedup_vs_rule']:.2f} "
            f"| {'yes' if r['keys_equal_rule'] else 'no'} |"
            for r in d["rows"]
        ),
    ]
    return "\n".join(lines + ["", _brgemm_provenance(docs)])


def log_odds_table(docs: list) -> str:
    """bench/log_odds_accuracy.py's record: |error| vs float64 by log-odds band, ours beside vLLM's."""
    d = docs[0]
    version = ".".join(d.get("vllm", "0.33").split(".")[:2])  # (records before 0.34 name no version: 0.33's)
    lines = [
        f"| float64 log-odds | rows | ours: max abs error | vLLM {version}: max abs error |",
        "|---|---|---|---|",
        *(
            f"| {b['band'][0]} to {b['band'][1]} | {b['rows']} | {b['ours_max_abs_err']:.2g} | "
            f"{b['vllm_max_abs_err']:.2g} |"
            for b in d["bands"]
        ),
    ]
    m = d["machine"]
    return "\n".join(
        lines
        + ["", f"From `{d['path']}`, written by `{d['command']}` on {d['date']} ({m['cpu']}, torch {m['torch']})."]
    )


def filtered_table(docs: list) -> str:
    """bench/filtered_sampling.py's record: per setting, the fallback share and bytes per rank at each tp, and time."""
    d = docs[0]
    tps = [k for k in d["rows"][0] if k.startswith("tp")]
    head = " | ".join(f"{tp}: fallback, KiB / rank (gather)" for tp in tps)
    lines = [f"| T | top_k | top_p | min_p | {head} | tp1 time: ours / gather+filter+sample (ms) |"]
    lines.append("|" + "---|" * (5 + len(tps)))
    for r in d["rows"]:
        cells = " | ".join(
            f"{r[tp]['fallback_share']:.0%}, {r[tp]['bytes_per_rank'] / 1024:.0f} "
            f"({r[tp]['gather_bytes_per_rank'] / 1024:.0f})"
            for tp in tps
        )
        t = r.get("time_s_tp1")
        timing = f"{t['ours'] * 1e3:.0f} / {t['gather_filter_sample'] * 1e3:.0f}" if t else "-"
        lines.append(f"| {r['temperature']} | {r['top_k']} | {r['top_p']} | {r['min_p']} | {cells} | {timing} |")
    m = d["machine"]
    return "\n".join(
        lines
        + [
            "",
            f"{d['model']} (V = {d['vocab']}, H = {d['hidden']}), batch {d['batch']}. From `{d['path']}`, written by "
            f"`{d['command']}` on {d['date']} ({m['cpu']}, {m['threads']} threads, torch {m['torch']}).",
        ]
    )


def host_time_table(docs) -> str:
    """``localargmax-bench --host-time``: µs per call (median, min-max), over the bare op, ops dispatched."""
    lines = []
    for d in docs:
        lines += [
            "| batch | method | µs/call (median) | min-max | over the bare op (µs) | ops (host) | ops (device path) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in d["rows"]:
            lines.append(
                f"| {r['batch']} | {r['method']} | {r['us_per_call']:.2f} | {r['us_min']:.2f}-{r['us_max']:.2f} | "
                f"{r['over_fused_op_us']:.2f} | {r['ops_host_path']} | {r['ops_device_path']} |"
            )
        env = d["env"]
        lines += [
            "",
            f"From `{d['path']}`, written by `{d['command']}` ({env['cpu']}, {env['cpu_count']} CPUs, torch "
            f"{env['torch']}, load {env['loadavg'][0]}). " + " ".join(d.get("verdicts", [])),
        ]
    return "\n".join(lines)


def emu_passes_table(docs) -> str:
    """``python -m bench.emu_bytes``: auto's CUDA route per op and batch, its weight passes, logits written."""
    lines = []
    for d in docs:
        ops = list(dict.fromkeys(r["op"] for r in d["rows"]))
        batches = list(dict.fromkeys(r["batch"] for r in d["rows"]))
        cell = {(r["op"], r["batch"]): r for r in d["rows"]}
        lines += ["| batch | " + " | ".join(ops) + " |", "|---|" + "---|" * len(ops)]
        for b in batches:
            row = []
            for op in ops:
                r = cell[(op, b)]
                tail = f", {r['logits_written_bytes'] / 2**20:.1f} MiB of logits" if r["logits_written_bytes"] else ""
                row.append(f"{r['route']}: {r['weight_passes']:g} pass{'es' if r['weight_passes'] != 1 else ''}{tail}")
            lines.append(f"| {b} | " + " | ".join(row) + " |")
        shard, emulated = d["shard"], d["emulated_shard"]
        lines += [
            "",
            f"From `{d['path']}`, written by `{d['command']}` ({d['cpu']}): the shard {shard['rows']} x "
            f"{shard['hidden']} {shard['dtype']}, routes for {d['device_model']['sm_count']} SMs; passes counted in "
            f"the emulation on a {emulated['rows']} x {emulated['hidden']} cut (gemm, cuBLAS, not emulated: one read, "
            "its logits written). Counted, not timed.",
        ]
    return "\n".join(lines)


def render(readme: str) -> str:
    """``readme`` with every marked table rendered again from its JSON files."""

    def replace(match):
        docs = load(match["glob"])
        if docs[0].get("kind") == "predicted":
            body = predicted_table(docs)
        elif docs[0].get("kind") == "predicted_target":
            body = predicted_target_table(docs)
        elif docs[0].get("kind") == "compile":
            body = compile_table(docs)
        elif docs[0].get("kind") == "epilogue_share":
            body = epilogue_table(docs)
        elif docs[0].get("kind") == "brgemm_blocks":
            body = blocks_table(docs)
        elif docs[0].get("kind") == "filtered":
            body = filtered_table(docs)
        elif docs[0].get("kind") == "vllm_drafters":  # bench/vllm_drafters.py's table per vLLM, the newest first
            from packaging.version import Version

            from bench.vllm_drafters import markdown

            body = "\n\n".join(markdown(d) for d in sorted(docs, key=lambda d: Version(d["vllm"]), reverse=True))
        elif docs[0].get("kind") == "vllm_engine":  # bench/vllm_engine.py: the plugin in real engines
            from bench.vllm_engine import markdown

            body = "\n\n".join(markdown(d) for d in docs)
        elif docs[0].get("kind") == "emu_weight_passes":
            body = emu_passes_table(docs)
        elif "bands" in docs[0]:
            body = log_odds_table(docs)
        elif "us_per_call" in docs[0]["rows"][0]:
            body = host_time_table(docs)
        elif "speedup_vs_first" in docs[0]["rows"][0]:
            body = paths_table(docs)
        else:
            body = install_table(docs) if "seconds" in docs[0]["rows"][0] else bench_table(docs)
        return f"{match.group(1)}{body}\n{match.group(4)}"

    return BLOCK.sub(replace, readme)


FILES = (ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "docs" / "vllm.md")


def main(argv=None) -> int:
    """Check (default) or rewrite the generated tables of :data:`FILES` (or ``--readme``); the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the files instead of checking them")
    parser.add_argument(
        "--readme", type=Path, action="append", help="a file to render (repeatable; default: both READMEs)"
    )
    args = parser.parse_args(argv)
    status = 0
    for path in args.readme or FILES:
        current = path.read_text()
        rendered = render(current)
        if args.write:
            path.write_text(rendered)
        elif rendered != current:
            diff = difflib.unified_diff(current.splitlines(), rendered.splitlines(), str(path), "rendered", lineterm="")
            print("\n".join(diff))
            print(
                f"{path} disagrees with bench/results/*.json: run python bench/readme_tables.py --write",
                file=sys.stderr,
            )
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
