"""The dispatch table (localargmax/dispatch.py, localargmax/dispatch_table.json):
it validates, covers every key, is what the model gives (no drift), follows the
issue's rules where the model says so, and ``path="auto"`` on CUDA resolves
through it."""

import copy
import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import localargmax.ops
from localargmax import dispatch
from localargmax.bench import predict as pm
from localargmax.bench import tune

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = json.loads(dispatch.TABLE_PATH.read_text())


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


def test_shipped_table_is_valid_predicted_and_packaged():
    dispatch.validate(SHIPPED)
    assert SHIPPED["source"] == "predicted" and "PREDICTED" in SHIPPED["label"]
    assert SHIPPED["model"]["version"] == pm.MODEL_VERSION
    assert all(e["source"] == "predicted" for t in SHIPPED["tables"] for e in t["entries"])
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*\nlocalargmax = \["dispatch_table\.json"\]', pyproject)


def test_regenerating_the_table_gives_the_shipped_file():
    # drift: the table must be what `localargmax-bench --predict --write-table` writes now
    assert SHIPPED["model"]["sha256"] == pm.model_sha256(), (
        "the model changed: run localargmax-bench --predict --write-table"
    )
    fresh = tune.predicted_table(pm.H200, tune.registers_of_table(SHIPPED), commit=SHIPPED["commit"])
    assert tune.dumps(fresh) == dispatch.TABLE_PATH.read_text(), "run localargmax-bench --predict --write-table"


def test_write_table_cli_writes_the_same_table(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localargmax.bench", "--predict", "--batch", "1", "--write-table", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    dispatch.validate(doc)
    if doc["registers_source"] == SHIPPED["registers_source"]:  # a CUDA build reads its own registers
        assert {k: v for k, v in doc.items() if k != "commit"} == {k: v for k, v in SHIPPED.items() if k != "commit"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_key_has_a_choice(dtype):
    table = dispatch.DispatchTable(SHIPPED)
    rng = random.Random(0)
    edges = SHIPPED["tables"][0]["edges"]
    points = {k: {0, 1, 2**31 - 1} | {e for e in edges[k]} - {2**31} | {e - 1 for e in edges[k] if e} for k in edges}
    points = {k: sorted(v | {rng.randrange(2**31) for _ in range(20)}) for k, v in points.items()}
    for h in points["hidden"]:
        for r in points["rows"]:
            for b in points["batch"]:
                c = table.choose("sm_90", dtype, h, r, b)
                assert c is not None and c.path in dispatch.PATHS and c.source == "predicted"
    assert table.choose("sm_80", dtype, 4096, 18992, 1) is None
    assert table.choose("sm_90", "float32", 4096, 18992, 1) is None
    with pytest.raises(ValueError):
        table.choose("sm_90", dtype, 4096, 18992, 2**31)


def test_cells_match_their_buckets_exactly():
    table = dispatch.DispatchTable(SHIPPED)
    for e in SHIPPED["tables"][0]["entries"]:
        for h in (e["hidden"][0], e["hidden"][1] - 1):
            for r in (e["rows"][0], e["rows"][1] - 1):
                for b in (e["batch"][0], e["batch"][1] - 1):
                    c = table.choose("sm_90", "bfloat16", h, r, b)
                    assert (c.path, c.variant) == (e["path"], e["variant"])
                    if c.path == "mma":  # only variants of C++ auto's summation order at that batch
                        assert c.variant in pm.mma_candidates(b), (e, b)


def test_remembered_cells_are_the_fresh_lookups(monkeypatch):
    """Eager lookups are remembered per table: a second lookup of a key (a hit)
    gives the cell a fresh table finds, for random keys and the buckets' edges,
    and the memo stops growing at MEMO_SIZE."""
    monkeypatch.setattr(dispatch, "MEMO_SIZE", 64)
    rng = random.Random()
    edges = SHIPPED["tables"][0]["edges"]
    near = lambda k: rng.choice([max(0, e + d) for e in edges[k][:-1] for d in (-1, 0, 1)])  # noqa: E731
    keys = [(near("hidden"), near("rows"), near("batch")) for _ in range(200)]
    keys += [(rng.randrange(2**31), rng.randrange(2**31), rng.randrange(2**31)) for _ in range(100)]
    remembering = dispatch.DispatchTable(SHIPPED)
    for dtype in ("bfloat16", "float16"):
        for key in keys * 2:
            assert remembering.choose("sm_90", dtype, *key) == dispatch.DispatchTable(SHIPPED).choose(
                "sm_90", dtype, *key
            ), key
    assert len(remembering._memo) == 64


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t["entries"].pop(5), "missing"),
        (lambda t: t["entries"].append(copy.deepcopy(t["entries"][0])), "duplicated"),
        (lambda t: t["edges"]["batch"].__setitem__(-1, 2**30), "edges"),
        (lambda t: t["entries"][3].__setitem__("batch", [0, 3]), "one bucket"),
        (lambda t: t["entries"][0].__setitem__("path", "wgmma"), "path"),
        (lambda t: t["entries"][0].update(path="mma", variant=None), "variant"),
        (lambda t: t["entries"][0].update(path="mma", variant=len(dispatch.MMA_VARIANT_IDS)), "variant"),
        (lambda t: t["entries"][0].update(path="mma", variant=True), "variant"),
        (lambda t: t["entries"][0].update(path="gemm", variant=4), "variant"),
    ],
)
def test_validate_rejects_broken_tables(mutate, message):
    doc = copy.deepcopy(SHIPPED)
    mutate(doc["tables"][0])
    with pytest.raises(ValueError, match=message):
        dispatch.validate(doc)
    bad = copy.deepcopy(SHIPPED)
    bad["source"] = "guessed"
    with pytest.raises(ValueError, match="source"):
        dispatch.validate(bad)


def test_table_choices_are_the_models_at_the_engine_shapes():
    table = dispatch.DispatchTable(SHIPPED)
    for s in pm.engine_shapes():
        for b in pm.ENGINE_BATCHES:
            chosen = table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b).op_path
            best, times = model_best(s, b)
            # the table's path is the model's fastest, or within the hysteresis of C++ auto's / the
            # bucket's worst case (a bucket holds two engine shapes at tp 8)
            assert times[chosen] <= tune.HYSTERESIS * 1.25 * times[best], (s.label, b, chosen, times)


def test_simt_for_small_batches_on_small_grids_where_the_model_says_so():
    table = dispatch.DispatchTable(SHIPPED)
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
    table = dispatch.DispatchTable(SHIPPED)
    batches = [1, 2, 4, 8, 16, 32, 33, 48, 64, 65, 96, 128, 256, 1024]
    for s in pm.engine_shapes():
        paths = [table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b).path for b in batches]
        crossover = next(b for i, b in enumerate(batches) if all(p == "gemm" for p in paths[i:]))
        # the pipelined kernel holds mma up to batch 64 on the Qwen3 shards (the old one lost from 17 / 9);
        # gemm from C++'s gemm batch at the latest
        assert crossover <= dispatch.CPP_GEMM_MIN_BATCH, (s.label, crossover)
        assert model_best(s, 128)[0] == "gemm"
        below = batches[batches.index(crossover) - 1] if crossover > 1 else None
        if below is not None and table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, below).path == "mma":
            _, times = model_best(s, below)
            assert times["mma"] <= tune.HYSTERESIS * times["gemm"] * 1.25, (s.label, below, times)
    qwen3 = [pm.engine_shape("qwen3", tp) for tp in (1, 4, 8)]
    assert all(table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, 64).path == "mma" for s in qwen3)


def _cpp_constant(name: str) -> set:
    found = set()
    for f in (ROOT / "csrc" / "cuda").iterdir():
        found |= {int(n) for n in re.findall(rf"constexpr int64_t {name}\s*=\s*(\d+);", f.read_text())}
    return found


def test_cpp_default_crossover_constant_is_mirrored():
    assert _cpp_constant("kDefaultGemmMinBatch") == {dispatch.CPP_GEMM_MIN_BATCH}, "update dispatch.CPP_* with csrc"
    assert _cpp_constant("kSimtMaxBatch") == {dispatch.CPP_SIMT_MAX_BATCH}
    assert _cpp_constant("kSimtMaxRowsPerSm") == {dispatch.CPP_SIMT_MAX_ROWS_PER_SM}


def test_cpp_defaults_are_the_models():
    """C++ auto's constants are the model's (predict.cpp_defaults, with the shipped table's registers):
    gemm from the crossover with the smallest worst slowdown, simt at small batches on tp-8 shards
    only where it beats the pipelined variants (it does not: 0 = off)."""
    got = pm.cpp_defaults(pm.H200, tune.registers_of_table(SHIPPED))
    assert got["gemm_min_batch"] == dispatch.CPP_GEMM_MIN_BATCH, got
    assert got["simt_max_batch"] == dispatch.CPP_SIMT_MAX_BATCH, got
    assert got["simt_max_rows_per_sm"] == dispatch.CPP_SIMT_MAX_ROWS_PER_SM, got
    assert got["gemm_worst_slowdown"] < 1.2, got


# --- path="auto" on CUDA ------------------------------------------------------------------------------------


def fake_table(path):
    doc = copy.deepcopy(SHIPPED)
    for e in doc["tables"][0]["entries"]:
        e["path"], e["variant"] = (path, None) if path != "mma" else ("mma", 7)
    return dispatch.DispatchTable(doc)


def tensors(batch, hidden, rows, dtype=torch.bfloat16):
    return torch.empty(batch, hidden, dtype=dtype), torch.empty(rows, hidden, dtype=dtype)


@pytest.mark.parametrize(
    "table_path, batch, hidden, dtype, expected",
    [
        ("simt", 4, 4096, torch.bfloat16, "simt"),
        ("gemm", 64, 4096, torch.float16, "gemm"),
        ("mma", 64, 4096, torch.bfloat16, "mma/7"),  # the table's variant
        ("mma", 256, 4096, torch.bfloat16, "mma/7"),
        ("mma", 256, 4100, torch.bfloat16, "auto"),  # the mma kernel cannot take H % 8 != 0: C++ decides
        ("gemm", 64, 4096, torch.float32, "auto"),  # no table for float32
    ],
)
def test_cuda_path_resolves_auto_from_the_table(monkeypatch, table_path, batch, hidden, dtype, expected):
    monkeypatch.setattr(dispatch, "table", lambda: fake_table(table_path))
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_90")
    h, w = tensors(batch, hidden, 18992, dtype)
    assert dispatch.cuda_path(h, w) == expected
    if expected.startswith("mma/"):  # a weight the mma kernel cannot take: C++ decides
        assert dispatch.cuda_path(h, torch.empty(18992, hidden + 8, dtype=dtype)[:, 1:-7]) == "auto"  # 2-byte offset
        assert dispatch.cuda_path(h, torch.empty(18992, hidden + 4, dtype=dtype)[:, :hidden]) == "auto"  # row stride
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_100")  # no table for this arch
    assert dispatch.cuda_path(h, w) == "auto"


def test_shipped_table_through_cuda_path(monkeypatch):
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_90")
    table = dispatch.table()
    for s in pm.engine_shapes():
        for b in (1, 4, 16, 64, 256):
            h, w = tensors(b, s.hidden, s.padded_rows)
            chosen = table.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b)
            assert dispatch.cuda_path(h, w) == chosen.op_path
            assert chosen.path != "mma" or chosen.op_path == f"mma/{chosen.variant}"


def test_cuda_path_traces_under_torch_compile(monkeypatch):
    # the lookup runs inside compiled code (fullgraph: no graph break) and picks what eager picks,
    # also with a dynamic batch (dynamo guards on the bucket)
    monkeypatch.setattr(dispatch, "_arch", torch.compiler.assume_constant_result(lambda index: "sm_90"))
    s = pm.engine_shape("qwen3", 8)
    code = {"simt": 1.0, "gemm": 2.0, "auto": 4.0, **{f"mma/{i}": 10.0 + i for i in dispatch.MMA_VARIANT_IDS}}

    def f(h, w):
        return h + code[dispatch.cuda_path(h, w)]

    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="eager", fullgraph=True, dynamic=dynamic)
        for b in (64, 4, 1):
            h, w = tensors(b, s.hidden, s.padded_rows)
            h.zero_()
            eager = dispatch.cuda_path(h, w)
            want = "auto" if eager.startswith("mma/") else eager  # no data pointer while tracing: C++ picks
            assert compiled(h, w)[0, 0].item() == code[want], (dynamic, b)
    torch._dynamo.reset()


def test_ops_resolve_only_cuda_auto(monkeypatch):
    calls = []
    monkeypatch.setattr(dispatch, "cuda_path", lambda h, w: calls.append(1) or "gemm")
    cuda_w = SimpleNamespace(device=torch.device("cuda", 0))
    assert localargmax.ops._auto_path("auto", None, cuda_w) == "gemm"
    assert localargmax.ops._auto_path("mma", None, cuda_w) == "mma"
    assert localargmax.ops._auto_path("auto", None, torch.empty(2, 2)) == "auto"
    assert len(calls) == 1
