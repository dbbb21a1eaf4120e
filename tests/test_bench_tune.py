"""``localargmax-bench --tune`` (localargmax.bench.tune): the measured table's flow with
a fake timer (no GPU), and the CPU refusal."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from localargmax import dispatch
from localargmax.bench import predict as pm
from localargmax.bench import tune

ROOT = Path(__file__).resolve().parents[1]
REGS = pm.Registers(dict(pm.DEFAULT_REGISTERS), "test defaults")


class FakeGPU:
    """Times that make the winner depend on the batch and the shard: simt up to
    batch 2, gemm from batch 40 on shards of >= 30000 rows (48 on smaller
    ones), mma in between; every call recorded."""

    def __init__(self):
        self.calls = []

    def __call__(self, path, rows, hidden, batch):
        self.calls.append((path, rows, hidden, batch))
        gemm_from = 40 if rows >= 30000 else 48
        if path == "simt":
            return 1e-6 * (1 if batch <= 2 else 50)
        if path == "gemm":
            return 1e-6 * (2 if batch >= gemm_from else 20)
        assert path.startswith("mma/"), path  # the ops' path of one tensor-core variant
        return 1e-6 * (9 if path == "mma/5" else 10)  # variant 5 wins wherever it is a candidate


def test_tune_picks_the_fastest_measured_path_per_engine_cell():
    gpu = FakeGPU()
    doc = tune.tune(pm.H200, gpu, REGS, device_name="fake H200", commit="abc")
    dispatch.validate(doc)
    assert doc["source"] == "measured" and doc["measured_on"] == "fake H200" and doc["commit"] == "abc"
    table = dispatch.DispatchTable(doc)
    for s in pm.engine_shapes():
        gemm_from = 40 if s.padded_rows >= 30000 else 48
        for b in tune.TUNE_BATCHES:
            c = table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b)
            want = "simt" if b <= 2 else "gemm" if b >= gemm_from else "mma"
            assert (c.path, c.source) == (want, "measured"), (s.label, b, c)
            if want == "mma":  # the fastest variant where it is a candidate (batch <= 32), else C++ auto's
                auto = pm.cpp_mma_variant(s.padded_rows, b)
                assert c.variant == (5 if 5 in pm.mma_candidates(b) else auto), (s.label, b, c)


def test_tune_times_each_path_once_and_skips_slow_simt():
    gpu = FakeGPU()
    doc = tune.tune(pm.H200, gpu, REGS, shapes=pm.engine_shapes([("qwen3", 8)]), batches=(1, 64))
    want = [(p, 18992, 4096, b) for b in (1, 64) for p in tune.timed(b) if p != "simt" or b <= tune.SIMT_MAX_BATCH]
    assert sorted(gpu.calls) == sorted(want)
    # the candidates, then the TMA twins (timed, never chosen)
    tma_1, tma_64 = {"mma/16", "mma/17", "mma/18"}, {"mma/19", "mma/20"}
    cands_1 = {"simt", "gemm", *(f"mma/{i}" for i in (4, 5, 6, 7, 8, 9, 13))}
    assert {p for p, _, _, b in want if b == 1} == cands_1 | tma_1
    assert {p for p, _, _, b in want if b == 64} == {"gemm", "mma/10", "mma/11", "mma/12", "mma/14", "mma/15"} | tma_64
    assert not (tma_1 | tma_64) & {p for b in (1, 64) for p in tune.candidates(b)}
    got = {(m["path"] if m["variant"] is None else f"mma/{m['variant']}", m["batch"]) for m in doc["measurements"]}
    assert got == {(p, b) for p, _, _, b in gpu.calls}


def test_cells_without_a_measurement_keep_the_models_choice():
    doc = tune.tune(pm.H200, FakeGPU(), REGS, shapes=pm.engine_shapes([("qwen3", 8)]), batches=(1,))
    predicted = dispatch.DispatchTable(tune.predicted_table(pm.H200, REGS, commit=""))
    measured = dispatch.DispatchTable(doc)
    entries = doc["tables"][0]["entries"]
    assert sum(e["source"] == "measured" for e in entries) == 1  # qwen3 tp8's cell at batch bucket [0, 2)
    for e in entries:
        if e["source"] == "predicted":
            key = ("sm_90", "bfloat16", e["hidden"][0], e["rows"][0], e["batch"][0])
            assert measured.choose(*key) == predicted.choose(*key)


def test_tune_writes_a_loadable_table(tmp_path):
    doc = tune.tune(pm.H200, FakeGPU(), REGS, shapes=pm.engine_shapes([("llama3", 8)]), batches=(1, 64))
    path = tmp_path / "table.json"
    tune.write_table(doc, path)
    loaded = dispatch.DispatchTable(json.loads(path.read_text()))
    s = pm.engine_shape("llama3", 8)
    assert loaded.choose("sm_90", "float16", s.hidden, s.padded_rows, 64).path == "gemm"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_tune_without_a_gpu_exits_2():
    proc = subprocess.run(
        [sys.executable, "-m", "localargmax.bench", "--tune"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 2
    assert "needs a GPU" in proc.stderr and "--predict" in proc.stderr


def test_tune_goes_smallest_shard_first_and_stops_at_its_seconds():
    gpu = FakeGPU()
    ticks = iter(range(1000))  # one "second" per (shape, batch) checked
    doc = tune.tune(pm.H200, gpu, REGS, batches=(1, 64), seconds=2.5, clock=lambda: next(ticks))
    dispatch.validate(doc)
    timed = sorted({(r, b) for _, r, _, b in gpu.calls})
    small = min(s.padded_rows for s in pm.engine_shapes())  # deepseek-v3 / llama3 tp 8 first
    assert {r for r, _ in timed} == {small} and len(timed) == 2, timed
    assert doc["tune_cut"] and "2.5 s spent" in doc["tune_cut"]
    entries = doc["tables"][0]["entries"]
    assert sum(e["source"] == "measured" for e in entries) == 2
    predicted = dispatch.DispatchTable(tune.predicted_table(pm.H200, REGS, commit=""))
    for e in entries:  # the cells not reached keep the model's choice
        if e["source"] == "predicted":
            key = ("sm_90", "bfloat16", e["hidden"][0], e["rows"][0], e["batch"][0])
            assert dispatch.DispatchTable(doc).choose(*key) == predicted.choose(*key)


def test_a_failing_candidate_is_recorded_and_the_table_still_written(tmp_path):
    """One candidate that raises (a launch the GPU refuses) does not lose the
    tune: its row records the error, it takes no cell, on_error runs, every
    (shape, batch) checkpoints a valid table, and the final table is written."""
    gpu = FakeGPU()
    recovered, written = [], []

    def flaky(path, rows, hidden, batch):
        if path == "mma/5":
            raise RuntimeError("CUDA error: invalid argument")
        return gpu(path, rows, hidden, batch)

    def checkpoint(doc):
        dispatch.validate(doc)
        tune.write_table(doc, tmp_path / "sub" / "table.json")
        written.append(len(doc["measurements"]))

    shapes = pm.engine_shapes([("qwen3", 8)])
    doc = tune.tune(pm.H200, flaky, REGS, shapes=shapes, batches=(1, 16), checkpoint=checkpoint,
                    on_error=lambda: recovered.append(1))  # fmt: skip
    failed = [m for m in doc["measurements"] if "error" in m]
    assert failed and all(m["variant"] == 5 and m["us"] is None and "invalid argument" in m["error"] for m in failed)
    assert len(recovered) == len(failed)
    assert written == sorted(written) and len(written) == 2, written  # one checkpoint per (shape, batch)
    on_disk = json.loads((tmp_path / "sub" / "table.json").read_text())
    dispatch.validate(on_disk)
    table = dispatch.DispatchTable(doc)
    for b in (1, 16):
        c = table.choose("sm_90", "bfloat16", 4096, 18992, b)
        assert not (c.path == "mma" and c.variant == 5), (b, c)  # the failed candidate wins nothing


def test_skipped_paths_are_not_timed():
    gpu = FakeGPU()
    shapes = pm.engine_shapes([("qwen3", 8)])
    doc = tune.tune(pm.H200, gpu, REGS, shapes=shapes, batches=(16,), skip={"mma/5", "gemm"})
    assert not any(p in ("mma/5", "gemm") for p, *_ in gpu.calls)
    rows = [m for m in doc["measurements"] if m["path"] == "gemm" or m["variant"] == 5]
    assert rows and all(m["us"] is None and "skipped" in m["error"] for m in rows)
