"""``python -m bench.tune`` (bench/tune.py): the measured table's flow with
a fake timer (no GPU), and the CPU refusal."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import predict as pm
from bench import tune
from localargmax import dispatch

ROOT = Path(__file__).resolve().parents[1]
REGS = pm.Registers(dict(pm.DEFAULT_REGISTERS), "test defaults")
MODEL_GEMM_MIN_BATCH = 65
"""The bandwidth model's gemm batch on an H200 (predict.cpp_defaults); C++ takes gemm from
dispatch.CPP_GEMM_MIN_BATCH, measured."""


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
        assert path.startswith("mma/"), path  # one tensor-core config
        return 1e-6 * (9 if path == "mma/n2_r64" else 10)  # n2_r64 wins wherever it is a candidate


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
            if want == "mma":  # the fastest config where it is a candidate (batch <= 32), else C++ auto's
                auto = pm.cpp_mma_config(s.padded_rows, b)
                assert c.config == ("n2_r64" if "n2_r64" in pm.mma_candidates(b) else auto), (s.label, b, c)


def test_tune_times_each_path_once_and_skips_slow_simt():
    gpu = FakeGPU()
    doc = tune.tune(pm.H200, gpu, REGS, shapes=pm.engine_shapes([("qwen3", 8)]), batches=(1, 64))
    want = [(p, 18992, 4096, b) for b in (1, 64) for p in tune.timed(b) if p != "simt" or b <= tune.SIMT_MAX_BATCH]
    assert sorted(gpu.calls) == sorted(want)
    # the candidates, then the TMA twins (timed, never chosen)
    tma_1, tma_64 = {"mma/n1_r64_tma", "mma/n2_r64_tma", "mma/n4_r128_tma"}, {"mma/n8_r256_tma", "mma/n8_r192_tma"}
    cands_1 = {"simt", "gemm", *(f"mma/{n}" for n in ("n1_r64", "n2_r64", "n1_r64_sk2", "n2_r64_sk2", "n4_r128"))}
    assert {p for p, _, _, b in want if b == 1} == cands_1 | tma_1
    wide = {"mma/n8_r256", "mma/n8_r192", "mma/n16_r64", "mma/n16_r64_w2"}
    assert {p for p, _, _, b in want if b == 64} == {"gemm", *wide} | tma_64
    assert not (tma_1 | tma_64) & {p for b in (1, 64) for p in tune.candidates(b)}
    got = {(m["path"] if m["config"] is None else f"mma/{m['config']}", m["batch"]) for m in doc["measurements"]}
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
        [sys.executable, "-m", "bench.tune", "--write-table", "unused.json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "needs a GPU" in proc.stderr and "bench.predict_cli --write-table" in proc.stderr
    assert not (ROOT / "unused.json").exists()


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
        if path == "mma/n2_r64":
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
    assert failed and all(
        m["config"] == "n2_r64" and m["us"] is None and "invalid argument" in m["error"] for m in failed
    )
    assert len(recovered) == len(failed)
    assert written == sorted(written) and len(written) == 2, written  # one checkpoint per (shape, batch)
    on_disk = json.loads((tmp_path / "sub" / "table.json").read_text())
    dispatch.validate(on_disk)
    table = dispatch.DispatchTable(doc)
    for b in (1, 16):
        c = table.choose("sm_90", "bfloat16", 4096, 18992, b)
        assert not (c.path == "mma" and c.config == "n2_r64"), (b, c)  # the failed candidate wins nothing


def test_skipped_paths_are_not_timed():
    gpu = FakeGPU()
    shapes = pm.engine_shapes([("qwen3", 8)])
    doc = tune.tune(pm.H200, gpu, REGS, shapes=shapes, batches=(16,), skip={"mma/n2_r64", "gemm"})
    assert not any(p in ("mma/n2_r64", "gemm") for p, *_ in gpu.calls)
    rows = [m for m in doc["measurements"] if m["path"] == "gemm" or m["config"] == "n2_r64"]
    assert rows and all(m["us"] is None and "skipped" in m["error"] for m in rows)


# --- the model's table (python -m bench.predict_cli --write-table) against the model ----------------------

# made with the registers of the committed PREDICTED results (a CUDA build's cuobjdump figures)
PREDICTED = tune.predicted_table(
    pm.H200, tune.registers_of_table(json.loads((ROOT / "bench" / "results" / "predicted_h200.json").read_text()))
)


def model_best(shape, b):
    """(fastest candidate, {candidate: seconds}) by the model at an engine shape; candidates are the
    ops' paths ``"simt"``, ``"gemm"``, ``"mma/<id>"`` (tune.candidates), plus ``"mma"``: the fastest
    mma variant's time."""
    times = {
        p: pm.predict(pm.H200, pm.todays_variant(p, b), shape.padded_rows, shape.hidden, b).time_s
        for p in tune.candidates(b)
    }
    best = min(times, key=times.get)
    times["mma"] = min(t for p, t in times.items() if p.startswith("mma/"))
    return best, times


def test_table_choices_are_the_models_at_the_engine_shapes():
    table = dispatch.DispatchTable(PREDICTED)
    for s in pm.engine_shapes():
        for b in pm.ENGINE_BATCHES:
            chosen = table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b).op_path
            best, times = model_best(s, b)
            # the table's path is the model's fastest, or within the hysteresis of C++ auto's / the
            # bucket's worst case (a bucket holds two engine shapes at tp 8)
            assert times[chosen] <= tune.HYSTERESIS * 1.25 * times[best], (s.label, b, chosen, times)


def test_simt_for_small_batches_on_small_grids_where_the_model_says_so():
    table = dispatch.DispatchTable(PREDICTED)
    small = [s for s in pm.engine_shapes() if s.padded_rows < 2 * 128 * pm.H200.sms]  # < 2 tiles per SM: tp 8
    assert small
    for s in small:
        for b in (1, 2, 4):
            best, times = model_best(s, b)
            chosen = table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b).path
            if best == "simt" and times["mma"] > tune.HYSTERESIS * times["simt"]:
                assert chosen == "simt", (s.label, b, times)
    big = pm.engine_shape("qwen3", 1)
    assert table.choose("sm_90", "bfloat16", big.hidden, big.padded_rows, 1).path == "mma"  # a full grid keeps mma


def test_gemm_crossover_follows_the_model():
    table = dispatch.DispatchTable(PREDICTED)
    batches = [1, 2, 4, 8, 16, 32, 33, 48, 64, 65, 96, 128, 256, 1024]
    for s in pm.engine_shapes():
        paths = [table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b).path for b in batches]
        crossover = next(b for i, b in enumerate(batches) if all(p == "gemm" for p in paths[i:]))
        # the model holds mma up to batch 64 on the Qwen3 shards (the H200 run did not: C++ takes gemm
        # from 17); gemm from the model's own gemm batch at the latest
        assert crossover <= MODEL_GEMM_MIN_BATCH, (s.label, crossover)
        assert model_best(s, 128)[0] == "gemm"
        below = batches[batches.index(crossover) - 1] if crossover > 1 else None
        if below is not None and table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, below).path == "mma":
            _, times = model_best(s, below)
            assert times["mma"] <= tune.HYSTERESIS * times["gemm"] * 1.25, (s.label, below, times)
    qwen3 = [pm.engine_shape("qwen3", tp) for tp in (1, 4, 8)]
    assert all(table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, 64).path == "mma" for s in qwen3)


def test_the_models_cpp_defaults():
    """The model's C++ constants (predict.cpp_defaults, with the committed results' registers): gemm
    from the crossover with the smallest worst slowdown (batch 65: the model has the KC = 1 rows even
    with gemm up to 64, which the H200 measurement refuted; C++ follows the measurement,
    test_cpp_auto_is_the_h200_measurements), simt never on the tp-8 shards (0 = off)."""
    got = pm.cpp_defaults(pm.H200, tune.registers_of_table(PREDICTED))
    assert got["gemm_min_batch"] == MODEL_GEMM_MIN_BATCH, got
    assert got["simt_max_batch"] == 0, got  # simt never pays on the tp-8 shards: C++ has no simt rule
    assert got["gemm_worst_slowdown"] < 1.2, got


def test_cpp_auto_is_the_h200_measurements():
    """C++ auto (choose_cuda_path, and choose_mma_config with the TMA rows an H200 runs) is within
    10% of the fastest path bench.tune measured on an H200 at every engine shard and batch it timed
    (bench/results/gpu_2026-12-04/tune_h200.csv; gemm from batch 65 and the cp.async rows were up to
    4.4x slower); every cell has C++ auto's candidate and gemm timed."""
    times = {}
    with open(ROOT / "bench" / "results" / "gpu_2026-12-04" / "tune_h200.csv") as f:
        for r in csv.DictReader(f):
            name = f"mma/{r['config']}" if r["path"] == "mma" else r["path"]
            times.setdefault((int(r["rows"]), int(r["batch"])), {})[name] = float(r["us"])
    assert len(times) >= 40
    worst = []
    for (rows, batch), cell in sorted(times.items()):
        auto = tune.incumbent_of(rows, batch)
        assert auto in cell and "gemm" in cell, (rows, batch, auto, sorted(cell))
        worst.append((cell[auto] / min(cell.values()), rows, batch, auto))
    assert max(worst)[0] <= 1.10, max(worst)
