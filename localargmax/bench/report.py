"""Result output: the environment record, speedup columns, the text table and
the JSON file ``{"env": {...}, "rows": [...], "command": "..."}``."""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys

import torch


def cpu_name() -> str:
    """The CPU's ``model name`` from /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


CPU_FEATURES = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
)
"""The CPU's ISA features that decide the CPU timings here (the fused
kernel's paths, localargmax._C._cpu_path; torch's AVX-512 / AMX GEMM),
recorded present or absent."""


def cpu_features(flags: str | None = None) -> dict:
    """``{feature: bool}`` for :data:`CPU_FEATURES`, from ``/proc/cpuinfo``'s
    flags (or ``flags``, a space-separated string); None values where the
    flags cannot be read."""
    if flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1] for line in f if line.startswith("flags")), None)
        except OSError:
            flags = None
    if flags is None:
        return {name: None for name in CPU_FEATURES}
    have = set(flags.split())
    return {name: name in have for name in CPU_FEATURES}


def cpu_auto_path() -> str:
    """The CPU kernel ``path="auto"`` runs on this CPU for float32 weights:
    ``"avx512"``, ``"avx2"`` or ``"generic"`` (the op's own choice from
    CPUID, :func:`localargmax.kernel_path`; never the opt-in
    ``"avx512_bf16"``)."""
    from ..paths import kernel_path

    return kernel_path(torch.float32)


def cpu_auto_paths_by_dtype(flags: str | None = None) -> dict:
    """``{dtype: path}``: the CPU path ``path="auto"`` runs for weights of
    each dtype on this CPU, or on one with ``flags`` (/proc/cpuinfo's
    space-separated names) (:func:`localargmax.kernel_path`; auto picks per dtype: brgemm for bf16 / fp16 where it is
    native, e.g. AMX; avx512_bf16 for bf16 on AVX-512-BF16 CPUs without AMX)."""
    from ..paths import kernel_path

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    return {str(d).removeprefix("torch."): kernel_path(d, cpu_flags=flags) for d in dtypes}


def cpu_paths_available() -> list[str]:
    """The named CPU paths (generic, avx2, avx512, avx512_bf16) this CPU can
    run: those the op's own choice (``localargmax._C._cpu_path``) accepts."""
    from .._ext import _C
    from .._validation import CPU_PATHS

    have = []
    for name in CPU_PATHS:
        try:
            _C._cpu_path(name)
        except ValueError:
            continue
        have.append(name)
    return have


def _inner_loop(path: str) -> str:
    from .._validation import CPU_PATHS

    return CPU_PATHS[path].inner_loop if path in CPU_PATHS else path


def env_info(device: str, threads: int) -> dict:
    """Versions and hardware of this run: python, torch, localargmax, platform,
    CPU name and count, torch threads per rank, the 1/5/15-minute load average
    when the run ended (other work on the machine skews CPU timings), the
    CPU's ISA features (:data:`CPU_FEATURES`, present or absent) and the CPU
    path ``auto`` chose (``cpu_path_auto``: for float32; ``cpu_path_auto_by_dtype``:
    per weight dtype); for CUDA the GPU name, driver and CUDA version."""
    from .. import __version__

    env = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        localargmax=__version__,
        platform=platform.platform(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count(),
        threads_per_rank=threads,
        loadavg=[round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        cpu_features=cpu_features(),
        cpu_path_auto=cpu_auto_path(),
        cpu_path_auto_by_dtype=cpu_auto_paths_by_dtype(),
    )
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["driver"] = _nvidia_driver()
    return env


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:  # driver's CUDA version, e.g. 13000 -> "cuda-driver-api 13.0"
        version = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        return f"cuda-driver-api {version // 1000}.{version % 1000 // 10}" if version else None
    except Exception:  # noqa: BLE001  best effort only
        return None


def add_speedups(rows: list[dict], baseline: str, column: str) -> None:
    """Set ``row[column]`` = baseline median / row median, for rows with the
    same shape and batch as a ``baseline`` row (None where there is none)."""
    base = {(r["shape"], r["batch"]): r["median_us"] for r in rows if r["method"] == baseline}
    for r in rows:
        b = base.get((r["shape"], r["batch"]))
        if b is not None and r["method"] != "stream-read":
            r[column] = b / r["median_us"]


_MULTI_COLUMNS = (
    ("method", "method"),
    ("shape", "shape"),
    ("tp", "tp"),
    ("batch", "batch"),
    ("median_us", "median_us"),
    ("p90_us", "p90_us"),
    ("bytes_sent_per_rank", "sent_B"),
    ("bytes_recv_per_rank", "recv_B"),
    ("speedup_vs_full_gather", "speedup"),
    ("agree", "agree"),
)
_KERNEL_COLUMNS = (
    ("method", "method"),
    ("shape", "shape"),
    ("tp", "tp"),
    ("rows", "rows"),
    ("batch", "batch"),
    ("dtype", "dtype"),
    ("median_us", "median_us"),
    ("p90_us", "p90_us"),
    ("gbps", "GB/s"),
    ("tflops", "TFLOP/s"),
    ("fraction_of_stream", "of_stream"),
    ("fraction_of_roofline", "of_roof"),
)


def _kernel_columns(rows: list[dict]) -> tuple:
    """The --kernel-only columns: :data:`_KERNEL_COLUMNS` (with ``path`` after
    ``dtype`` when a row ran a CPU path: its ``cpu_path``), then a ``vs_*``
    ratio per baseline present, each followed by ``FS_*`` (FlashSampling's
    published H200 ratio for the same cell) when any row has one, then
    ``vs_gemm_keys`` (CUDA), ``agree`` and ``note`` (compile fallback, skip
    reason)."""
    from .rival import BASELINES

    columns = list(_KERNEL_COLUMNS)
    if any(r.get("cpu_path") for r in rows):
        columns.insert(columns.index(("dtype", "dtype")) + 1, ("cpu_path", "path"))
    seen = set()
    for column, title, _ in BASELINES.values():
        published = any(column in (r.get("flashsampling_h200") or {}) for r in rows)
        if column in seen or not (published or any(r.get(column) is not None for r in rows)):
            continue
        seen.add(column)
        columns.append((column, title))
        if published:
            columns.append((("flashsampling_h200", column), "FS_" + title[3:]))
    if any(r.get("speedup_vs_gemm_keys") is not None for r in rows):
        columns.append(("speedup_vs_gemm_keys", "vs_gemm_keys"))
    columns.append(("agree", "agree"))
    if any(r.get("agree_vllm") is not None for r in rows):
        columns.append(("agree_vllm", "agree_vllm"))
    if any(r.get("note") or r.get("skip_reason") for r in rows):
        columns.append(("note", "note"))
    return tuple(columns)


def cell_value(row: dict, key):
    """The value of one table column in a row (``key`` as in :func:`table_columns`)."""
    if isinstance(key, tuple):  # ("flashsampling_h200", column): the published ratio
        return ((row.get(key[0]) or {}).get(key[1]) or {}).get("ratio")
    if key == "note":
        return row.get("skip_reason") or row.get("note")
    return row.get(key)


def device_label(device: str) -> str:
    """What our figures were measured on, for tables and plots: "CPU", or
    "CUDA <GPU name>"."""
    if device == "cuda" and torch.cuda.is_available():
        return f"CUDA {torch.cuda.get_device_name()}"
    return device.upper()


def format_cell(value) -> str:
    """One table cell as the CLI prints it: "-" for None; floats with 3 decimals
    below 10, 1 below 100, none from 100 up."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:.0f}"
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def _multi_columns(rows: list[dict]) -> tuple:
    """The multi-rank columns: a ``k`` column after ``batch`` when there are
    topk rows, ``path`` (the CPU path of the fused rows) before the times
    when a row has one, ``tp_inv`` (tp_invariance) after ``agree`` when
    there are sample rows; argmax rows without a CPU path get exactly
    :data:`_MULTI_COLUMNS`."""
    columns = list(_MULTI_COLUMNS)
    if any(r.get("op") == "topk" for r in rows):
        columns.insert(columns.index(("batch", "batch")) + 1, ("k", "k"))
    if any(r.get("op") == "sample" for r in rows):
        columns.append(("tp_invariance", "tp_inv"))
    if any("fallback_share" in r for r in rows):
        columns.append(("fallback_share", "fallback"))
    if any(r.get("cpu_path") for r in rows):  # (results recorded before it lack the column)
        columns.insert(columns.index(("median_us", "median_us")), ("cpu_path", "path"))
    if any("bytes_sent_vllm" in r for r in rows):  # (results recorded before it lack the column)
        columns.insert(columns.index(("bytes_recv_per_rank", "recv_B")) + 1, ("bytes_sent_vllm", "vllm_B"))
    return tuple(columns)


def table_columns(rows: list[dict], kernel_only: bool) -> tuple:
    """The printed table's ``(JSON key, column title)`` pairs for these rows."""
    return _kernel_columns(rows) if kernel_only else _multi_columns(rows)


def format_table(rows: list[dict], kernel_only: bool) -> str:
    """Plain aligned text table of the rows (numbers right-aligned)."""
    columns = table_columns(rows, kernel_only)
    cells = [[title for _, title in columns]] + [[format_cell(cell_value(r, key)) for key, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def kernel_legend(rows: list[dict]) -> str:
    """The lines under a --kernel-only table: what the figures were measured
    on and what the ratio columns mean."""
    lines = [
        f"our figures: {device_label(rows[0]['device'])}; vs_* = baseline median / this median; "
        "of_roof = max(bytes / stream-read, flops / gemm-peak) / median"
    ]
    if any(r.get("flashsampling_h200") for r in rows):
        lines.append(
            "FS_* = FlashSampling's published H200 bf16 speedup over the same baseline (tp 1, same shape "
            "and batch; FS_gumbel and FS_flashinfer: over FI2); sources in the JSON (flashsampling_h200)"
        )
    else:
        from .rival import published_summary

        summary = published_summary(rows)
        if summary:
            lines.append(summary)
    return "\n".join(lines)


# One-line definitions of the table's columns: the legend under the printed
# table and the "columns:" section of --help both use these words.
DEFINITIONS = {
    "median_us": "rank 0's step time in µs (median, 90th percentile)",
    "sent_B": "bytes one rank sends per step",
    "recv_B": "bytes one rank receives per step",
    "vllm_B": "bytes one rank sends per step in vLLM's own path (0.34 and 0.33 alike) for the op",
    "speedup": "full-gather's median time / this row's (same shape, batch)",
    "agree": "fraction of rows whose ids equal the float64 reference's",
    "agree_topk": "fraction of rows whose K ids equal the reference's, in order",
    "tp_inv": "fraction of rows whose sample equals the one-rank sample",
    "agree_filtered": "fraction of rows whose id equals full-gather's filters with the kernels' noise",
    "fallback": "share of rows recomputed from gathered logits (filtered sampling)",
    "kernel_median_us": "one local step's time in µs (median, 90th percentile)",
    "gbps": "weight bytes read / median time",
    "vs_torch": "torch-matmul-max's median time / this row's",
    "vs_torch_topk": "torch-matmul-topk's median time / this row's",
    "of_stream": "this row's GB/s / the stream-read row's GB/s",
    "path": "the CPU path the row's fused kernel ran (localargmax.kernel_path; JSON cpu_path)",
    "agree_vllm": "fraction of rows whose id equals vllm-gumbel-logits' (--noise vllm)",
}


def format_legend(rows: list[dict], kernel_only: bool) -> str:
    """The two-line legend printed under :func:`format_table`'s table, in the
    words of :data:`DEFINITIONS` (the same as ``--help``'s)."""
    d = DEFINITIONS
    if kernel_only:
        titles = {title for _, title in table_columns(rows, kernel_only)}
        first = f"of_stream = {d['of_stream']}"
        if "vs_torch" in titles:  # sampling tables name their own baselines (vs_gumbel, ...: kernel_legend)
            vs_torch = d["vs_torch_topk"] if rows and rows[0].get("op") == "topk" else d["vs_torch"]
            first = f"vs_torch = {vs_torch}; {first}"
        second = f"median_us, p90_us = {d['kernel_median_us']}; GB/s = {d['gbps']}"
        if "agree_vllm" in titles:
            first += f"; agree_vllm = {d['agree_vllm']}"
    else:
        op = rows[0].get("op", "argmax") if rows else "argmax"
        agree = {
            "argmax": f"agree = {d['agree']}",
            "topk": f"agree = {d['agree_topk']}",
            "sample": f"tp_inv = {d['tp_inv']}",
        }[op]
        if any("fallback_share" in r for r in rows):
            agree = f"agree = {d['agree_filtered']}; {agree}; fallback = {d['fallback']}"
        first = f"speedup = {d['speedup']}; {agree}"
        second = f"sent_B = {d['sent_B']}; recv_B = {d['recv_B']}"
        if any("bytes_sent_vllm" in r for r in rows):
            second += f"; vllm_B = {d['vllm_B']}"
    return f"{first}\n{second} (all columns: --help)"


SCHEDULER_TICKS_US = (1000.0, 4000.0, 10000.0)  # CONFIG_HZ 1000, 250, 100
PARTS = {"lm-head-step": ("fused-kernel",)}  # a row's method -> methods timed inside it (never longer)
IMPOSSIBLE_MARGIN = 0.95  # a whole under 95% of its part's median: past a quiet machine's run-to-run noise


def timing_warnings(rows: list[dict], *, loadavg=None, cores=None, tp: int = 1, threads: int = 1) -> list[str]:
    """What makes this run's CPU timings suspect, in words: a 1-minute load
    above the core count; ``tp x threads`` above the cores; medians that sit on
    multiples of one scheduler tick (at least 3 rows of >= 1 tick, most of
    them within 1% of a tick of a multiple: the timer measures the scheduler,
    not the kernel); a row faster than a part timed inside it (``PARTS``)."""
    out = []
    cores = cores or os.cpu_count() or 1
    if loadavg is not None and loadavg[0] > cores:
        out.append(f"the 1-minute load average {loadavg[0]:.2f} is above the {cores} cores: other work shared them")
    if tp * threads > cores:
        out.append(f"tp {tp} x {threads} threads per rank = {tp * threads} threads on {cores} cores: oversubscribed")
    medians = [r["median_us"] for r in rows if r.get("median_us")]
    for tick in sorted(SCHEDULER_TICKS_US, reverse=True):  # the longest tick first (its multiples are the others')
        long = [m for m in medians if m >= tick * 0.99]
        on_tick = [m for m in long if abs(m - round(m / tick) * tick) <= 0.01 * tick]
        if len(on_tick) >= 3 and len(on_tick) * 2 > len(long):
            shown = ", ".join(f"{m:.0f}" for m in sorted(on_tick)[:4])
            out.append(
                f"{len(on_tick)} of {len(long)} medians >= {tick / 1000:g} ms sit on multiples of {tick / 1000:g} ms "
                f"({shown} us): the scheduler tick, not the kernel, sets them; rerun on a quiet machine"
            )
            break
    index = {(r.get("shape"), r.get("tp"), r.get("batch"), r["method"]): r for r in rows if r.get("median_us")}
    for (shape, tp_, batch, method), whole in index.items():
        for part in PARTS.get(method, ()):
            inner = index.get((shape, tp_, batch, part))
            if inner is None or whole.get("cpu_path") != inner.get("cpu_path"):  # --cpu-path: not a part of it
                continue
            if whole["median_us"] < IMPOSSIBLE_MARGIN * inner["median_us"]:
                out.append(
                    f"{shape} tp {tp_} B={batch}: {method} ({whole['median_us']:.1f} us) timed faster than {part} "
                    f"({inner['median_us']:.1f} us) inside it: the timings are noise here"
                )
    return out


LOCAL_RIVALS = {
    "unfused-local": "torch's matmul + max",
    "torch-matmul-max": "torch's matmul + max",
    "torch-matmul-topk": "torch's matmul + topk",
    "gumbel-logits": "torch's matmul + Gumbel-max",
    "compiled-multinomial": "torch's matmul + softmax + multinomial",
}
"""The rows that run torch's GEMM on the same shard as our fused kernel, and what they run."""


def cpu_legend(rows: list[dict], features: dict, path) -> str | None:
    """One line for a CPU run with fused rows: the CPU path the fused
    kernel ran for each dtype of the rows (a row's ``cpu_path``, else
    ``path``: a name, or ``{dtype: name}`` as
    :func:`cpu_auto_paths_by_dtype`) and what torch's GEMM can use here;
    with a row that runs torch's matmul on the same shard
    (:data:`LOCAL_RIVALS`, the first present), what decides between the
    two. Names only methods the rows have."""
    methods = {r["method"] for r in rows}
    if not rows or rows[0].get("device") != "cpu" or not ({"fused", "fused-kernel"} & methods):
        return None
    fast = [n for n in ("amx_bf16", "avx512_bf16", "avx512f") if features.get(n)]
    gemm = f"torch's GEMM here can use {', '.join(fast)}" if fast else "torch's GEMM here has AVX2 at most"
    ran = {}  # dtype -> path, in row order
    for r in rows:
        if r["method"] in ("fused", "fused-kernel"):
            dtype = r.get("dtype", "float32")
            fallback = path.get(dtype) if isinstance(path, dict) else path
            ran.setdefault(dtype, r.get("cpu_path") or fallback)
    if len(ran) == 1:
        name = next(iter(ran.values()))
        kernel = f"the local kernel (path {name!r}: {_inner_loop(name)}, for {next(iter(ran))})"
    else:
        kernel = "the local kernel (" + "; ".join(f"{d}: path {p!r}: {_inner_loop(p)}" for d, p in ran.items()) + ")"
    rival = next((m for m in LOCAL_RIVALS if m in methods), None)
    if rival is None:
        return f"CPU: the fused rows run {kernel}; {gemm}"
    ours = "fused" if "fused" in methods else "fused-kernel"
    line = f"CPU: {ours} vs {rival} is {kernel} against {LOCAL_RIVALS[rival]} on this CPU; {gemm}"
    if rival in ("unfused-local", "torch-matmul-max"):
        line += f", so where it runs wider tiles {rival} can win at batch >= 8"
    return line


NOTCH = 1.57
"""A median's notch is ``median ± NOTCH · IQR / √steps`` (McGill, Tukey and Larsen's box-plot notch, about a 95%
interval for the median): two medians whose notches overlap are not told apart."""


def notch(row: dict) -> tuple[float, float] | None:
    """The row's median notch in µs, or None for a row without quartiles (JSON of older runs)."""
    q1, q3, n = row.get("p25_us"), row.get("p75_us"), row.get("steps")
    if q1 is None or q3 is None or not n:
        return None
    half = NOTCH * (q3 - q1) / math.sqrt(n)
    return row["median_us"] - half, row["median_us"] + half


def _overlap(a: dict, b: dict) -> bool:
    """Whether two rows' median notches overlap (False where either has no quartiles)."""
    na, nb = notch(a), notch(b)
    return na is not None and nb is not None and na[0] <= nb[1] and nb[0] <= na[1]


def compare(ours: dict, rival: dict) -> str:
    """``ours`` against ``rival`` as a verdict clause: the ratio of the medians where their notches separate
    (or a row has no quartiles), else "within noise" and about how many steps would tell a difference of
    this size apart (the notches narrow as 1 / √steps)."""
    a, b = ours["median_us"], rival["median_us"]
    na, nb = notch(ours), notch(rival)
    if _overlap(ours, rival):
        line = f"{ours['method']} and {rival['method']} within noise ({a:.1f} vs {b:.1f} us, notches overlap"
        width = (na[1] - na[0] + nb[1] - nb[0]) / 2
        if a != b:
            steps = max(ours["steps"], rival["steps"])
            need = math.ceil(steps * (width / abs(a - b)) ** 2)
            line += f"; about --steps {need} on a machine this loaded would separate them"
        return line + ")"
    ratio = b / a
    how = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{ours['method']} {how} than {rival['method']}"


def verdicts(rows: list[dict], kernel_only: bool) -> list[str]:
    """One line per (shape, tp, batch): the fastest method (its median, its
    agreement when below 1, and the methods within noise of it), then ours against the rival (:func:`compare`:
    a ratio only where the medians' notches separate): fused against
    full-gather; --kernel-only: fused-kernel against the op's first torch
    baseline present. Yardsticks and skipped rows take no part."""
    from .rival import OP_BASELINES

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("batch") is not None and r.get("median_us"):  # (yardsticks have no batch)
            where = f"tp {r['tp']}" if r.get("tp") is not None else f"rows {r.get('rows')}"
            groups.setdefault((r["shape"], where, r["batch"]), []).append(r)
    lines = []
    for (shape, where, batch), group in groups.items():
        by_method = {r["method"]: r for r in group}
        best = min(group, key=lambda r: r["median_us"])
        line = f"{shape} {where} B={batch}: fastest {best['method']} ({format_cell(best['median_us'])} us"
        agree = best.get("agree")
        line += f", agree {agree:.3f}" if agree is not None and agree < 1 else ""
        close = [r["method"] for r in group if r is not best and _overlap(best, r)]
        line += f"; within noise of {', '.join(close)})" if close else ")"
        if kernel_only:
            ours = "fused-kernel"
            rivals = OP_BASELINES.get(group[0].get("op", "argmax"), ())
            rival = next((m for m in rivals if m in by_method), None)
        else:
            ours, rival = "fused", "full-gather"
        if ours in by_method and rival in by_method:
            line += "; " + compare(by_method[ours], by_method[rival])
        lines.append(line)
    return lines


def finish(rows: list[dict], cfg, kernel_only: bool) -> None:
    """Print the table (to stderr when the JSON goes to stdout) and write the JSON."""
    to_stdout = cfg.json_path == "-"
    out = sys.stderr if to_stdout else sys.stdout
    if rows:
        first = rows[0]
        header = (
            f"device={first['device']} dtype={first['dtype']} threads/rank={cfg.threads} "
            f"steps={cfg.steps} warmup={cfg.warmup}"
        )
        op = first.get("op", "argmax")
        if op == "topk":
            header += f" op=topk k={first['k']}"
        elif op == "sample":
            header += f" op=sample temperature={first['temperature']:g} seed={first['seed']} offset={first['offset']}"
            if first.get("noise", "philox") != "philox":
                header += f" noise={first['noise']}"
            if "top_k" in first:
                header += f" top_k={first['top_k']} top_p={first['top_p']:g} min_p={first['min_p']:g}"
        if first.get("log_probs"):
            header += " log_probs"
        print(header, file=out)
    print(format_table(rows, kernel_only), file=out)
    print(format_legend(rows, kernel_only), file=out, flush=True)
    if kernel_only and rows:
        print(kernel_legend(rows), file=out, flush=True)
    for line in verdicts(rows, kernel_only):
        print(f"verdict: {line}", file=out, flush=True)
    device = getattr(cfg, "device", rows[0].get("device", "cpu") if rows else "cpu")
    env = env_info(device, cfg.threads)
    line = cpu_legend(rows, env["cpu_features"], env["cpu_path_auto_by_dtype"])
    if line:
        print(line, file=out)
    warnings = timing_warnings(
        rows, loadavg=env["loadavg"], cores=env["cpu_count"], tp=getattr(cfg, "tp", 1), threads=cfg.threads
    )
    for w in warnings:
        print(f"WARNING: {w}", file=out, flush=True)
    if cfg.json_path:
        doc = {"env": env, "warnings": warnings, "rows": rows, "command": shlex.join(cfg.command)}
        text = json.dumps(doc, indent=2)
        if to_stdout:
            print(text, flush=True)
        else:
            write_output(cfg.json_path, text + "\n")
            print(f"wrote {len(rows)} rows to {cfg.json_path}", file=out)


def write_output(path, text: str) -> None:
    """Write ``text`` to ``path`` ('-': stdout), creating its folders: every
    file the CLI writes (``--json``, ``--write-table``) goes through here, so a
    computed table is never lost to a missing folder."""
    if str(path) == "-":
        sys.stdout.write(text)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
