"""localargmax/dispatch.py: ``path="auto"`` on CUDA is C++'s own choice unless
``LOCALARGMAX_DISPATCH_TABLE`` names a measured table; no table ships; a
table validates, covers every key and is looked up exactly (tables made by
the bench/ tools: the model's, and a tune with the model as its timer)."""

import copy
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import localargmax.ops
from bench import predict as pm
from bench import tune
from localargmax import dispatch
from localargmax._validation import MMA_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
REGS = pm.Registers(dict(pm.DEFAULT_REGISTERS), "test defaults")
PREDICTED = tune.predicted_table(pm.H200, REGS, commit="")
MEASURED = tune.tune(pm.H200, tune.model_timer(pm.H200, REGS), REGS, batches=(1, 64), commit="")


@pytest.fixture
def measured_file(tmp_path, monkeypatch):
    """LOCALARGMAX_DISPATCH_TABLE names a measured table in a temporary folder."""
    path = tmp_path / "measured.json"
    tune.write_table(MEASURED, path)
    monkeypatch.setenv("LOCALARGMAX_DISPATCH_TABLE", str(path))
    return path


def test_no_table_ships_and_auto_is_cpps_choice(monkeypatch):
    package = ROOT / "localargmax"
    assert not list(package.rglob("*.json")), "no dispatch table (or other JSON) in the package"
    assert "package-data" not in (ROOT / "pyproject.toml").read_text()
    monkeypatch.delenv("LOCALARGMAX_DISPATCH_TABLE", raising=False)
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_90")
    assert dispatch.table() is None
    for b in (1, 16, 256):
        assert dispatch.cuda_path(*tensors(b, 4096, 18992)) == "auto"


def test_the_knob_loads_a_measured_table_once(measured_file, monkeypatch):
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_90")
    first = dispatch.table()
    assert first is not None and first.source == "measured" and dispatch.table() is first
    for s in pm.engine_shapes():
        for b in (1, 4, 16, 64, 256):
            chosen = first.choose("sm_90", "bfloat16", s.hidden, s.padded_rows, b)
            assert dispatch.cuda_path(*tensors(b, s.hidden, s.padded_rows)) == chosen.op_path
    monkeypatch.delenv("LOCALARGMAX_DISPATCH_TABLE")  # read at use: unset again -> C++ decides
    assert dispatch.table() is None


def test_the_knob_refuses_what_is_not_a_measured_table(tmp_path, monkeypatch):
    predicted = tmp_path / "predicted.json"
    tune.write_table(PREDICTED, predicted)
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "localargmax.dispatch_table/3", "source": "measured"')
    for path, message in (
        (predicted, "'predicted' table; path='auto' follows only a measured one"),
        (tmp_path / "missing.json", "missing.json"),
        (broken, "broken.json"),
    ):
        monkeypatch.setenv("LOCALARGMAX_DISPATCH_TABLE", str(path))
        with pytest.raises(ValueError, match=re.escape(message)):
            dispatch.table()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_key_has_a_choice(dtype):
    table = dispatch.DispatchTable(PREDICTED)
    rng = random.Random(0)
    edges = PREDICTED["tables"][0]["edges"]
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
    table = dispatch.DispatchTable(PREDICTED)
    for e in PREDICTED["tables"][0]["entries"]:
        for h in (e["hidden"][0], e["hidden"][1] - 1):
            for r in (e["rows"][0], e["rows"][1] - 1):
                for b in (e["batch"][0], e["batch"][1] - 1):
                    c = table.choose("sm_90", "bfloat16", h, r, b)
                    assert (c.path, c.config) == (e["path"], e["config"])
                    if c.path == "mma":  # only configs of C++ auto's summation order at that batch
                        assert c.config in pm.mma_candidates(b), (e, b)


def test_remembered_cells_are_the_fresh_lookups(monkeypatch):
    """Eager lookups are remembered per table: a second lookup of a key (a hit)
    gives the cell a fresh table finds, for random keys and the buckets' edges,
    and the memo stops growing at MEMO_SIZE."""
    monkeypatch.setattr(dispatch, "MEMO_SIZE", 64)
    rng = random.Random()
    edges = PREDICTED["tables"][0]["edges"]
    near = lambda k: rng.choice([max(0, e + d) for e in edges[k][:-1] for d in (-1, 0, 1)])  # noqa: E731
    keys = [(near("hidden"), near("rows"), near("batch")) for _ in range(200)]
    keys += [(rng.randrange(2**31), rng.randrange(2**31), rng.randrange(2**31)) for _ in range(100)]
    remembering = dispatch.DispatchTable(PREDICTED)
    for dtype in ("bfloat16", "float16"):
        for key in keys * 2:
            assert remembering.choose("sm_90", dtype, *key) == dispatch.DispatchTable(PREDICTED).choose(
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
        (lambda t: t["entries"][0].update(path="mma", config=None), "config"),
        (lambda t: t["entries"][0].update(path="mma", config="n3_r64"), "config"),
        (lambda t: t["entries"][0].update(path="mma", config=7), "config"),
        (lambda t: t["entries"][0].update(path="gemm", config="n1_r64"), "config"),
    ],
)
def test_validate_rejects_broken_tables(mutate, message):
    doc = copy.deepcopy(PREDICTED)
    mutate(doc["tables"][0])
    with pytest.raises(ValueError, match=message):
        dispatch.validate(doc)
    bad = copy.deepcopy(PREDICTED)
    bad["source"] = "guessed"
    with pytest.raises(ValueError, match="source"):
        dispatch.validate(bad)


def _cpp_constant(name: str) -> set:
    found = set()
    for f in (ROOT / "csrc" / "cuda").iterdir():
        found |= {int(n) for n in re.findall(rf"constexpr int64_t {name}\s*=\s*(\d+);", f.read_text())}
    return found


def test_cpp_default_crossover_constant_is_mirrored():
    assert _cpp_constant("kDefaultGemmMinBatch") == {dispatch.CPP_GEMM_MIN_BATCH}, "update dispatch.CPP_* with csrc"
    assert not hasattr(dispatch, "CPP_SIMT_MAX_BATCH") and not _cpp_constant("kSimtMaxBatch")  # no simt rule


# --- path="auto" on CUDA ------------------------------------------------------------------------------------


def fake_table(path):
    doc = copy.deepcopy(PREDICTED)
    for e in doc["tables"][0]["entries"]:
        e["path"], e["config"] = (path, None) if path != "mma" else ("mma", "n1_r64_sk2")
    return dispatch.DispatchTable(doc)


def tensors(batch, hidden, rows, dtype=torch.bfloat16):
    return torch.empty(batch, hidden, dtype=dtype), torch.empty(rows, hidden, dtype=dtype)


@pytest.mark.parametrize(
    "table_path, batch, hidden, dtype, expected",
    [
        ("simt", 4, 4096, torch.bfloat16, "simt"),
        ("gemm", 64, 4096, torch.float16, "gemm"),
        ("mma", 64, 4096, torch.bfloat16, "mma/n1_r64_sk2"),  # the table's config, as the C++ op's path
        ("mma", 256, 4096, torch.bfloat16, "mma/n1_r64_sk2"),
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


def test_a_gemm_cell_past_the_gemm_row_limit_is_left_to_cpp(monkeypatch):
    """A table's gemm cell covers shards the gemm path refuses (past 2**21
    rows, cuBLAS's limit): there ``auto`` stays auto (C++ takes mma)."""
    monkeypatch.setattr(dispatch, "table", lambda: fake_table("gemm"))
    monkeypatch.setattr(dispatch, "_arch", lambda index: "sm_90")
    h = torch.empty(64, 8, dtype=torch.bfloat16)
    assert dispatch.cuda_path(h, torch.empty(2**21, 8, dtype=torch.bfloat16)) == "gemm"
    assert dispatch.cuda_path(h, torch.empty(2**21 + 1, 8, dtype=torch.bfloat16)) == "auto"


def test_cuda_path_traces_under_torch_compile(measured_file, monkeypatch):
    # the lookup runs inside compiled code (fullgraph: no graph break; the table of the last eager
    # lookup, no file read) and picks what eager picks, also with a dynamic batch (dynamo guards on
    # the bucket)
    monkeypatch.setattr(dispatch, "_arch", torch.compiler.assume_constant_result(lambda index: "sm_90"))
    s = pm.engine_shape("qwen3", 8)
    assert dispatch.table() is not None  # an eager lookup first
    code = {"simt": 1.0, "gemm": 2.0, "auto": 4.0, **{f"mma/{n}": 10.0 + i for i, n in enumerate(MMA_CONFIGS)}}

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


def test_log_partition_ops_resolve_auto_as_the_plain_ones(monkeypatch):
    """shard_argmax / shard_sample with log_partition ask the dispatch table as the plain calls do,
    so a measured table gives the *_lse ops the plain op's path and config (its keys bit for bit)."""
    seen = []
    monkeypatch.setattr(localargmax.ops, "_auto_path", lambda path, h, w: seen.append(path) or path)
    h, w, t = torch.randn(3, 16), torch.randn(40, 16), torch.full((3,), 0.7)
    for log_partition in (False, True):
        seen.clear()
        localargmax.shard_argmax(h, w, log_partition=log_partition)
        localargmax.shard_sample(h, w, t, 1, log_partition=log_partition)
        assert seen == ["auto", "auto"], (log_partition, seen)
