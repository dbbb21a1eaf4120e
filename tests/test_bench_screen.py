"""The benchmark's first screen (localargmax-bench's printed output): one
verdict line per shape and batch (the fastest method, fused against
full-gather), a footer that names only methods the table has, and --help
examples that write no tracked file. tests/test_bench_cli.py runs the CLI
itself (its smoke runs check the verdict lines too)."""

from __future__ import annotations

import json
import re
import subprocess
import types
from pathlib import Path

import pytest

from localargmax.bench import report
from localargmax.bench.cli import DESCRIPTION, EPILOG
from localargmax.bench.rival import BASELINES, OUR_METHODS
from localargmax.bench.runner import METHODS

ROOT = Path(__file__).resolve().parents[1]
KNOWN_METHODS = set(METHODS) | set(BASELINES) | set(OUR_METHODS)  # (the legend's formulas name the yardsticks)
VERDICT = re.compile(
    r"(?P<shape>\S+) (?P<where>tp \d+|rows \d+) B=(?P<batch>\d+): fastest (?P<best>[\w-]+) \([\d.]+ us"
    r"(?:, agree (?P<agree>[\d.]+))?(?:; within noise of (?P<close>[\w, -]+))?\)"
    r"(?:; (?P<ours>[\w-]+) (?P<ratio>[\d.]+)x (?P<how>faster|slower) than "
    r"(?P<rival>[\w-]+)|; (?P<noisy>[\w-]+) and (?P<noisy_rival>[\w-]+) within noise \(.*\))?$"
)


def results(name: str) -> list[dict]:
    return json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())["rows"]


def _parsed(rows, kernel_only):
    lines = report.verdicts(rows, kernel_only)
    parsed = [VERDICT.match(line) for line in lines]
    assert all(parsed), lines
    return {(m["shape"], int(m["batch"])): m for m in parsed}, len(lines)


def test_verdict_names_the_fastest_and_fused_against_full_gather(gen):
    """Random medians: per (shape, batch) the fastest row and the ratio
    full-gather / fused, computed here from the rows; a fastest row that
    disagrees with the reference says so; without a fused row, no ratio."""
    import torch

    rows = []
    for shape in ("a", "b-d2t"):
        for batch in (1, 8, 64):
            methods = METHODS if (shape, batch) != ("b-d2t", 64) else ("full-gather", "unfused-local")
            for method in methods:
                median = float(torch.randint(100, 100000, (1,), generator=gen)) / 10
                agree = 0.75 if method == "unfused-local" else 1.0
                rows.append(dict(method=method, shape=shape, tp=2, batch=batch, median_us=median, agree=agree))
    verdicts, count = _parsed(rows, False)
    assert count == 6
    for (shape, batch), m in verdicts.items():
        cell = {r["method"]: r for r in rows if (r["shape"], r["batch"]) == (shape, batch)}
        best = min(cell.values(), key=lambda r: r["median_us"])
        assert m["where"] == "tp 2" and m["best"] == best["method"]
        assert (m["agree"] is not None) == (best["agree"] < 1)
        if "fused" not in cell:
            assert m["ratio"] is None
            continue
        ratio = cell["full-gather"]["median_us"] / cell["fused"]["median_us"]
        assert (m["ours"], m["rival"]) == ("fused", "full-gather")
        assert m["how"] == ("faster" if ratio >= 1 else "slower")
        assert float(m["ratio"]) == pytest.approx(ratio if ratio >= 1 else 1 / ratio, abs=0.006)


@pytest.mark.parametrize(
    "name,rival", [("cpu_kernel_qwen3_bf16", "torch-matmul-max"), ("cpu_kernel_sample_qwen3_tp1", "gumbel-logits")]
)
def test_kernel_only_verdict_agrees_with_the_rows_own_speedup(name, rival):
    """--kernel-only: fused-kernel against the op's first torch baseline; the
    ratio equals the committed row's own speedup column (kernel.annotate)."""
    rows = results(name)
    verdicts, count = _parsed(rows, True)
    cells = {(r["shape"], r["batch"]) for r in rows if r["batch"] is not None}
    assert count == len(cells) and set(verdicts) == cells
    column = BASELINES[rival][0]
    for (shape, batch), m in verdicts.items():
        ours = next(r for r in rows if (r["shape"], r["batch"], r["method"]) == (shape, batch, "fused-kernel"))
        speedup = ours[column]
        assert (m["ours"], m["rival"]) == ("fused-kernel", rival)
        assert float(m["ratio"]) == pytest.approx(speedup if speedup >= 1 else 1 / speedup, abs=0.006)


def _footer(rows, kernel_only, capsys, monkeypatch) -> str:
    """What report.finish prints under the table."""
    monkeypatch.setattr(report.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    report.finish(rows, types.SimpleNamespace(json_path=None, threads=1, steps=3, warmup=1), kernel_only)
    out = capsys.readouterr().out
    table = report.format_table(rows, kernel_only)
    assert table in out
    return out.split(table, 1)[1]


def _step_rows(op, methods):
    extra = {"topk": dict(k=8), "sample": dict(temperature=1.0, seed=0, offset=0, tp_invariance=1.0)}.get(op, {})
    return [
        dict(method=m, op=op, shape="s", tp=2, batch=b, device="cpu", dtype="float32", median_us=10.0 + i, p90_us=20.0)
        | dict(bytes_sent_per_rank=8, bytes_recv_per_rank=8, speedup_vs_full_gather=1.0, agree=1.0, **extra)
        for b in (1, 8)
        for i, m in enumerate(methods)
    ]


@pytest.mark.parametrize(
    "case",
    ["argmax", "topk", "sample", "kernel:cpu_kernel_qwen3_bf16", "kernel:cpu_kernel_sample_qwen3_tp1", "kernel:topk"],
)
def test_footer_names_only_methods_the_table_has(case, capsys, monkeypatch):
    """--op topk / sample print no word about matmul + max or unfused-local
    rows they do not have (argmax, which has them, is the control)."""
    if case.startswith("kernel:"):
        kernel_only = True
        if case == "kernel:topk":  # the argmax run's rows as a topk run's: torch-matmul-topk
            rows = [
                dict(
                    r, op="topk", k=8, method="torch-matmul-topk" if r["method"] == "torch-matmul-max" else r["method"]
                )
                for r in results("cpu_kernel_qwen3_bf16")
            ]
        else:
            rows = results(case[len("kernel:") :])
    else:
        kernel_only = False
        methods = ("full-gather", "unfused-local", "fused") if case == "argmax" else ("full-gather", "fused")
        rows = _step_rows(case, methods)
    footer = _footer(rows, kernel_only, capsys, monkeypatch)
    present = {r["method"] for r in rows}
    named = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+", footer)) & KNOWN_METHODS
    assert named <= present, (named - present, footer)
    has_max = bool({"unfused-local", "torch-matmul-max"} & present)
    assert ("matmul + max" in footer) == has_max, footer
    assert footer.count("\nverdict: ") == len({(r["shape"], r["batch"]) for r in rows if r["batch"] is not None})


def test_help_examples_write_no_tracked_file():
    """Pasting an example of --help must not overwrite a committed result."""
    tracked = set(subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout.split())
    if not tracked:
        pytest.skip("not a git checkout (git ls-files listed nothing)")
    outputs = re.findall(r"--json (\S+)", DESCRIPTION + EPILOG)
    assert outputs, "the examples write JSON somewhere"
    for path in outputs:
        assert path == "-" or (path not in tracked and not path.startswith("bench/results")), path


def test_verdict_says_within_noise_where_the_notches_overlap():
    """Rows with quartiles: a ratio only where the medians' notches
    (median +- 1.57 IQR / sqrt(steps)) separate; else "within noise" and the
    --steps that would separate a difference of that size (computed here)."""
    import math

    def row(method, median, q1, q3, steps=20):
        return dict(method=method, shape="s", tp=2, batch=1, median_us=median, p25_us=q1, p75_us=q3, steps=steps)

    clear = report.verdicts([row("fused", 10.0, 9.5, 10.5), row("full-gather", 14.0, 13.5, 14.5)], False)
    assert clear == ["s tp 2 B=1: fastest fused (10.0 us); fused 1.40x faster than full-gather"]
    assert VERDICT.match(clear[0])["close"] is None
    noisy = report.verdicts([row("fused", 10.0, 6.0, 16.0), row("full-gather", 12.0, 8.0, 18.0)], False)
    m = VERDICT.match(noisy[0])
    assert m and (m["noisy"], m["noisy_rival"], m["ratio"]) == ("fused", "full-gather", None), noisy
    assert m["close"] == "full-gather"  # the fastest is named with the methods within noise of it
    width = 2 * 1.57 * 10.0 / math.sqrt(20)  # the two half-widths: separated once |difference| exceeds their sum
    assert f"about --steps {math.ceil(20 * (width / 2.0) ** 2)} " in noisy[0], noisy
    same = report.verdicts([row("fused", 10.0, 6.0, 16.0), row("full-gather", 10.0, 8.0, 18.0)], False)
    assert "within noise" in same[0] and "--steps" not in same[0]
    old = report.verdicts([dict(row("fused", 10.0, 6, 16), p25_us=None), row("full-gather", 12.0, 8.0, 18.0)], False)
    assert old[0].endswith("fused 1.20x faster than full-gather")  # JSON without quartiles: the ratio, as before
