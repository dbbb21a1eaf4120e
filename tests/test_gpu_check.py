"""bench/gpu_check.sh --dry-run on this machine (no GPU): every step in order,
at most 8 files named as a real run names them, a step that times out leaves
the other steps' files, and a spent budget skips steps instead of overrunning.

The dry run reuses the extension this test suite imported (it builds only when
none is built): the first test takes ~60 s on this project's 2 busy cores (five
Python processes importing torch), ~25 s idle; the second ~8 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
FILES = {
    "plan.json",
    "gpu_check.log",
    "env.txt",
    "build.txt",
    "bench.tar.gz",
    "tests.xml",
    "sanitizer.txt",
    "summary.txt",
}
STEPS = ("env", "build", "configs", "smoke", "steptime", "bench", "tests", "memcheck")

HUNG_TESTS = """
import time


def test_passes():
    pass


def test_past_the_per_test_alarm():
    time.sleep(30)


def test_hung_past_the_step_cap():
    while True:  # a hang the per-test alarm cannot end: only the step's timeout can
        try:
            time.sleep(30)
        except TimeoutError:
            pass
"""


def _dry_run(out: Path, **env) -> tuple:
    full = dict(os.environ, PYTHON=sys.executable, **{k: str(v) for k, v in env.items()})
    full.pop("GPU_CHECK_DRY_BUILD", None)
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", str(out)], env=full, capture_output=True, text=True, timeout=300
    )
    return proc, time.monotonic() - start


def _steps(out: Path) -> dict:
    """{step: (rc, note)} from summary.txt's step table."""
    table = {}
    for line in (out / "summary.txt").read_text().splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] in STEPS + ("total",):
            table[parts[0]] = (parts[1], parts[3] if len(parts) > 3 else "")
    return table


def test_dry_run_walks_every_step_and_a_timed_out_step_leaves_the_others_files(tmp_path):
    hung = tmp_path / "hung" / "test_hung.py"
    hung.parent.mkdir()
    hung.write_text(HUNG_TESTS)
    out = tmp_path / "out"
    budget = 200
    proc, wall = _dry_run(
        out,
        GPU_CHECK_BUDGET_S=budget,
        GPU_CHECK_BENCH="qwen3_tp8 qwen3_sample qwen3_target_tp8 qwen3_topk8_tp8",
        GPU_CHECK_TESTS=str(hung),
        GPU_CHECK_TEST_TIMEOUT=2,
        GPU_CHECK_CAP_TESTS=9,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]  # the tests step failed (timed out)
    assert wall < budget, wall
    assert {p.name for p in out.iterdir()} == FILES, log[-3000:]
    assert all(p.is_file() for p in out.iterdir())

    # every step ran, in the order of STEPS; only the tests step timed out
    text = (out / "gpu_check.log").read_text()
    starts = [text.index(f"== {step} (cap") for step in STEPS]
    assert starts == sorted(starts)
    steps = _steps(out)
    assert {s: steps[s][1] for s in STEPS} == {**{s: "ok" for s in STEPS}, "tests": "TIMEOUT after 9s"}, steps

    # the per-test alarm failed one test, the step's timeout interrupted the hung one,
    # and pytest still wrote the junit XML of what it ran
    cases = {c.get("name"): c for c in ET.parse(out / "tests.xml").getroot().iter("testcase")}
    assert cases["test_passes"].find("failure") is None
    assert "alarm-timeout" in ET.tostring(cases["test_past_the_per_test_alarm"], encoding="unicode")

    with tarfile.open(out / "bench.tar.gz") as tar:
        names = set(tar.getnames())
        assert {"bench/bench_qwen3_tp8.json", "bench/bench_qwen3_sample.json", "bench/smoke.json"} <= names, names
        rows = json.load(tar.extractfile("bench/bench_qwen3_tp8.json"))["rows"]
        sample_rows = json.load(tar.extractfile("bench/bench_qwen3_sample.json"))["rows"]
        target_rows = json.load(tar.extractfile("bench/bench_qwen3_target_tp8.json"))["rows"]
        topk_rows = json.load(tar.extractfile("bench/bench_qwen3_topk8_tp8.json"))["rows"]
        smoke = json.load(tar.extractfile("bench/smoke.json"))
        # the tune sub-step ran first in the bench step: on the CPU it says it cannot tune and leaves the
        # model's table (a GPU run leaves dispatch_table_measured.json + tune.json there)
        tuned = json.load(tar.extractfile("bench/dispatch_table_predicted.json"))
    bench_log = text[text.index("== bench (cap") : text.index("== tests (cap")]
    assert bench_log.index("-- tune (cap") < bench_log.index("-- bench qwen3_tp8"), bench_log[:2000]
    assert "SKIPPED on the CPU (bench.tune needs a GPU" in bench_log
    assert "-m bench.tune --seconds" in SCRIPT.read_text() and "dispatch_table_measured.json" in SCRIPT.read_text()
    from localargmax import dispatch

    dispatch.validate(tuned)
    assert tuned["source"] == "predicted"
    assert rows and {r["timing"] for r in rows} == {"host"}  # CPU rows: host timer (CUDA: cuda_graph)
    assert {r["agree"] for r in rows if r["agree"] is not None} == {1.0}
    assert smoke["failed"] == 0 and any(c["ok"] for c in smoke["cases"])
    assert [c["ok"] for c in smoke["cases"] if c["op"] == "filtered_sample"] == [True], "filtered sampling vs float64"
    assert "SKIPPED" in (out / "sanitizer.txt").read_text()
    assert "sanitize workload: ok" in (out / "sanitizer.txt").read_text()
    assert "qwen3_tp8" in (out / "summary.txt").read_text()
    # the rival sampling rows: ours beside both torch baselines, per batch, in the summary
    methods = {(r["method"], r["batch"]) for r in sample_rows if r["op"] == "sample"}
    assert {(m, b) for m in ("fused-kernel", "gumbel-logits", "compiled-multinomial") for b in (1, 8)} <= methods
    rival = (out / "summary.txt").read_text().split("sampling beside FlashSampling")[1]
    rival = rival.split("target sampling with")[0].splitlines()
    assert [line.split()[:2] for line in rival[2:]] == [["qwen3_sample", "1"], ["qwen3_sample", "8"]], rival
    # the target sampler's row (issue #57): vLLM's noise in ours, vLLM's gumbel_sample on the shard's logits
    ours = [r for r in target_rows if r["method"] == "fused-kernel"]
    assert [r["batch"] for r in ours] == [1, 8] and all(r["noise"] == "vllm" and r["agree_vllm"] == 1.0 for r in ours)
    target = (out / "summary.txt").read_text().split("target sampling with vLLM's noise")[1].splitlines()
    assert [line.split()[:2] for line in target[2:4]] == [["qwen3_target_tp8", "1"], ["qwen3_target_tp8", "8"]]
    # tree drafting's top-8 row (issue #69): the fused top-k beside torch's, the reference's ids in order
    fused = [r for r in topk_rows if r["op"] == "topk" and r["method"] == "fused-kernel"]
    assert [r["batch"] for r in fused] == [1, 8] and all(r["k"] == 8 and r["agree"] == 1.0 for r in fused), fused


def test_dry_run_with_its_budget_spent_skips_steps_and_still_leaves_every_file(tmp_path):
    out = tmp_path / "out"
    budget = 14  # 10 s are kept for the summary: env gets 4 s, nothing is left after it
    proc, wall = _dry_run(out, GPU_CHECK_BUDGET_S=budget)
    log = proc.stdout + proc.stderr
    assert wall < budget + 20, (wall, log[-3000:])
    assert {p.name for p in out.iterdir()} == FILES, log[-3000:]
    steps = _steps(out)
    # what little budget env leaves (its time varies with the machine's load) may still let the
    # dry run's build (a reuse of the built extension) finish, or end in its TIMEOUT; nothing
    # after it runs
    assert steps[STEPS[1]][1] == "ok" or any(w in steps[STEPS[1]][1] for w in ("skipped", "TIMEOUT")), steps
    assert all("skipped" in steps[s][1] or "TIMEOUT" in steps[s][1] for s in STEPS[2:]), steps
    assert sum("TIMEOUT" in steps[s][1] for s in STEPS[1:]) <= 1, steps


if not SCRIPT.exists():  # pragma: no cover
    pytest.skip("bench/gpu_check.sh missing", allow_module_level=True)


FAKE_WORKER = """
import sys, time
start = int(sys.argv[sys.argv.index("--start") + 1])
names = ["a", "b", "c", "d", "e"]
print("READY", flush=True)
for name in names[start:]:
    print("START", name, flush=True)
    if name == "b":
        time.sleep(60)  # a hang: only the driver's timeout ends it
    if name == "c":
        print("ERROR c RuntimeError: CUDA error: an illegal memory access", flush=True)
        sys.exit(3)
    if name == "d":
        print("REFUSED d needs compute capability 9.0", flush=True)
        continue
    print("OK", name, flush=True)
"""


def test_configs_step_survives_a_hang_and_an_error(tmp_path):
    """bench/gpu_check.py configs: a config that hangs or errors costs its
    worker, the next worker starts after it, and every config is recorded;
    the ones that hung or errored are listed to skip."""
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    out = tmp_path / "configs.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "configs", "--device", "cpu", "--json", str(out)]
    cmd += ["--names", "a,b,c,d,e", "--worker", f"{sys.executable} {worker}", "--per-config", "2", "--startup", "20"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 40, "the hang was not cut at --per-config"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    status = {name: r["status"] for name, r in doc["configs"].items()}
    assert status == {"a": "ok", "b": "hang", "c": "error", "d": "refused", "e": "ok"}, doc
    assert doc["skip"] == ["b", "c"]
    assert "illegal memory access" in doc["configs"]["c"]["detail"]


def test_the_plan_fits_the_budget_with_both_sanitizer_tools(tmp_path):
    """The caps of the real run (the default budget) add up to at most the
    budget less the summary's reserve, memcheck and racecheck get >= 45 s
    each, every step has a cap, and at most 8 files come back."""
    proc = subprocess.run(["bash", str(SCRIPT), "--plan", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert tuple(plan["steps"]) == STEPS
    assert sum(plan["steps"].values()) <= plan["budget_s"] - plan["reserve_s"], plan
    assert min(plan["memcheck_tools_s"].values()) >= 45, plan
    assert sum(plan["memcheck_tools_s"].values()) <= plan["steps"]["memcheck"], plan
    assert plan["budget_s"] <= 590 - 30 and len(FILES) <= 8
