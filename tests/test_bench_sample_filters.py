"""``localargmax-bench --op sample --top-k/--top-p/--min-p`` (issue 49) and the
CPU path the bench records per dtype (issue 48): the flags parse and refuse
bad values, the gather baseline's filters and the fused filtered sample equal
a float64 reference away from near-ties, the fallback share is what the
candidates imply, and a tiny run's JSON has the new columns."""

from __future__ import annotations

import json
import math

import pytest
import torch

import localargmax
from localargmax import sampling
from localargmax.bench import filtered, report
from localargmax.bench.cli import build_parser, main
from tests.support.launch import run_bench, run_ranks
from tests.support.problems import make_shards

SEED = 11
TIE = 1e-4  # float32 logits of |x| <~ 10 from float32 inputs of H 32: errors far below this


@pytest.mark.parametrize(
    "flag, value",
    [("--top-p", "0"), ("--top-p", "1.5"), ("--top-p", "nan"), ("--min-p", "-0.1"), ("--min-p", "2"),
     ("--top-k", "-2"), ("--top-k", "x"), ("--cpu-path", "amx")],
)  # fmt: skip
def test_bad_filter_values_exit_2_naming_the_flag(capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        build_parser("localargmax-bench").parse_args(["--op", "sample", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_good_filter_values_parse():
    args = build_parser("p").parse_args(["--op", "sample", "--top-k", "50", "--top-p", "0.9", "--min-p", "0.05"])
    assert (args.top_k, args.top_p, args.min_p) == (50, 0.9, 0.05)
    args = build_parser("p").parse_args(["--op", "sample", "--top-p", "1", "--min-p", "0"])
    assert (args.top_k, args.top_p, args.min_p, args.cpu_path) == (None, 1.0, 0.0, "auto")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--top-k", "5"], "--top-k: only with --op sample"),
        (["--op", "topk", "--min-p", "0.1"], "--min-p: only with --op sample"),
        (["--op", "sample", "--kernel-only", "--top-p", "0.9"], "not --kernel-only"),
        (["--cpu-path", "generic"], "--cpu-path goes with --kernel-only"),
    ],
)
def test_inconsistent_options_are_usage_errors(capsys, argv, words):
    assert main(argv + ["--smoke"]) == 2
    assert words in capsys.readouterr().err


def _problem(batch=96, vocab=509, hidden=32, scale=2.5):
    g = torch.Generator().manual_seed(5)
    h = torch.randn(batch, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * (scale / math.sqrt(hidden))
    return h, w


def reference(logits64, t, k, p, mp, seed):
    """float64 filters of vLLM's meaning on full rows (descending stable sort,
    ties to the smaller id), then argmax of ``y + g``; and per row whether a
    decision sits within TIE of flipping (k-th value, top-p mass, min-p
    threshold, Gumbel argmax)."""
    y = logits64 / t
    ys, ids = torch.sort(y, dim=1, descending=True, stable=True)
    n, v = y.shape
    pos = torch.arange(v)[None]
    keep = torch.ones_like(ys, dtype=torch.bool)
    near = torch.zeros(n, dtype=torch.bool)
    if mp > 0:
        thr = ys[:, :1] + math.log(mp)
        keep &= ys >= thr
        near |= ((ys - thr).abs() < TIE).any(dim=1)
    if 0 < k < v:
        keep &= pos < k
        near |= (ys[:, k - 1] - ys[:, k]).abs() < TIE
    if p < 1:
        w = torch.where(keep, torch.exp(ys - ys[:, :1]), 0.0)
        before = (w.cumsum(dim=1) - w) / w.sum(dim=1, keepdim=True)
        near |= (((before - p).abs() < TIE) & keep).any(dim=1)
        keep &= (before < p) | (pos == 0)
    score = torch.where(keep, ys + sampling.gumbel_noise(seed, torch.arange(n)[:, None], ids).double(), -math.inf)
    top2 = score.topk(2, dim=1).values
    near |= (top2[:, 0] - top2[:, 1]) < TIE
    return ids.gather(1, score.argmax(dim=1, keepdim=True))[:, 0], near


SETTINGS = [(0.7, 20, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (0.7, 50, 0.95, 0.05), (1.0, 100, 1.0, 0.0)]


@pytest.mark.parametrize("t, k, p, mp", SETTINGS)
def test_baseline_and_fused_filtered_sample_equal_the_float64_reference(t, k, p, mp):
    h, w = _problem()
    want, near = reference(h.double() @ w.double().T, t, k, p, mp, SEED)
    assert (~near).float().mean() > 0.8, "too many near-ties: the check would be empty"
    unfiltered, _ = reference(h.double() @ w.double().T, t, 0, 1.0, 0.0, SEED)
    assert (unfiltered != want).float().mean() > 0.05, "the filters change no sample: the check could not fail"
    base = filtered.gather_filter_sample(h, w, temperature=t, top_k=k, top_p=p, min_p=mp, seed=SEED, noise="gumbel")
    ours = localargmax.lm_head_sample(h, w, temperature=t, seed=SEED, top_k=k, top_p=p, min_p=mp)
    assert torch.equal(base[~near], want[~near]), (base != want).nonzero()[:5]
    assert torch.equal(ours[~near], want[~near]), (ours != want).nonzero()[:5]


@pytest.mark.parametrize("t, k, p, mp", SETTINGS)
def test_fallback_share_is_what_the_candidates_imply(t, k, p, mp):
    h, w = _problem()
    shares = {tp: filtered.fallback_share(h, w, tp, t, k, p, mp) for tp in (1, 2, 3)}
    assert all(0.0 <= s <= 1.0 for s in shares.values()), shares
    for tp, share in shares.items():
        if k > tp * sampling.CANDIDATES and mp == 0 and p == 1:  # more ids than the ranks send: every row
            assert share == 1.0, (tp, share)
        if 0 < k <= sampling.CANDIDATES and mp == 0 and p == 1:
            assert share == 0.0, (tp, share)  # every rank's top-64 holds its part of the top-k
    assert filtered.filtered_bytes(8, 0, 100) == 8 * localargmax.payload_length(8, 65, True)  # 64 + the noised best
    assert filtered.filtered_bytes(8, 3, 100) == 8 * (
        localargmax.payload_length(8, 65, True) + sampling.fallback_payload_length(3, 100)
    )


def test_tiny_run_has_the_filter_columns_and_the_baseline_row(tmp_path):
    out = tmp_path / "f.json"
    proc = run_bench(
        "--smoke", "--model", "synthetic", "--dtype", "float32", "--op", "sample", "--temperature", "0.7",
        "--top-k", "20", "--top-p", "0.9", "--batch", "16", "--no-progress", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fallback" in proc.stdout and "top_k=20 top_p=0.9 min_p=0" in proc.stdout
    doc = json.loads(out.read_text())
    rows = {r["method"]: r for r in doc["rows"]}
    assert set(rows) == {"full-gather", "batch-sharded", "fused"}
    sharded = rows["batch-sharded"]
    assert (sharded["bytes_sent_per_rank"], sharded["bytes_recv_per_rank"]) == filtered.batch_sharded_bytes(
        16, sharded["rows"], 4, sharded["tp"]
    )
    assert sharded["ranks_agree"] == 1.0 and "cpu_path" not in sharded
    for r in rows.values():
        assert (r["top_k"], r["top_p"], r["min_p"], r["temperature"]) == (20, 0.9, 0.0, 0.7)
    fused, base = rows["fused"], rows["full-gather"]
    assert 0.0 <= fused["fallback_share"] <= 1.0
    n_fallback = round(fused["fallback_share"] * 16)
    assert fused["bytes_sent_per_rank"] == filtered.filtered_bytes(16, n_fallback, fused["rows"])
    assert base["bytes_sent_per_rank"] == 16 * base["rows"] * 4
    assert fused["agree"] >= 15 / 16  # the same noise: equal but at a float32 near-tie
    assert fused["tp_invariance"] == 1.0 and fused["ranks_agree"] == 1.0
    assert fused["cpu_path"] == doc["env"]["cpu_path_auto_by_dtype"]["float32"]


def test_cpu_path_recorded_per_dtype():
    amx = "avx2 fma f16c avx512f avx512bw avx512_bf16 amx_tile amx_bf16"
    assert report.cpu_auto_paths_by_dtype(amx) == {"float32": "avx512", "bfloat16": "brgemm", "float16": "avx512"}
    assert set(report.cpu_auto_paths_by_dtype("avx2 fma f16c").values()) == {"avx2"}
    rows = [
        {"method": "fused", "device": "cpu", "dtype": "bfloat16", "cpu_path": "brgemm"},
        {"method": "fused", "device": "cpu", "dtype": "float32", "cpu_path": "avx512"},
    ]
    line = report.cpu_legend(rows, {"avx512f": True}, {"float32": "avx2", "bfloat16": "avx2"})
    assert "bfloat16: path 'brgemm'" in line and "float32: path 'avx512'" in line, line
    unnamed = [{k: v for k, v in r.items() if k != "cpu_path"} for r in rows[:1]]
    assert "path 'brgemm'" in report.cpu_legend(unnamed, {}, report.cpu_auto_paths_by_dtype(amx))


def test_forced_cpu_path_is_run_and_recorded(tmp_path):
    proc = run_bench(
        "--kernel-only", "--smoke", "--batch", "1", "--cpu-path", "generic", "--no-plot", "--no-progress",
        "--json", str(tmp_path / "k.json"), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["method"]: r for r in json.loads((tmp_path / "k.json").read_text())["rows"]}
    assert rows["fused-kernel"]["cpu_path"] == "generic" and rows["fused-kernel"]["agree"] == 1.0
    assert rows["lm-head-step"]["cpu_path"] == localargmax.kernel_path(torch.float32)
    assert "path 'generic'" in proc.stdout
    # the printed table's path column names what each row ran (issue 54: it was in the JSON only)
    lines = proc.stdout.splitlines()
    header = next(line.split() for line in lines if line.startswith("method"))
    cells = {row[0]: row for row in map(str.split, lines) if row[:1] in (["fused-kernel"], ["lm-head-step"])}
    at = header.index("path")
    assert header[at - 1] == "dtype"
    assert cells["fused-kernel"][at] == "generic"
    assert cells["lm-head-step"][at] == localargmax.kernel_path(torch.float32)


def test_rendered_note_names_auto_per_dtype_where_it_differs():
    from bench import readme_tables

    env = dict(cpu="X", cpu_count=2, torch="t", threads_per_rank=1, loadavg=[0.5], cpu_features={"avx512f": True})
    doc = {"env": dict(env, cpu_path_auto="avx512"), "command": "c", "path": "p.json"}
    assert "CPU path auto: avx512)" in readme_tables._provenance([doc])
    doc["env"]["cpu_path_auto_by_dtype"] = {"float32": "avx512", "bfloat16": "brgemm"}
    assert "CPU path auto: float32 avx512, bfloat16 brgemm)" in readme_tables._provenance([doc])


# ----------------------------------------------------------------------------- vLLM 0.34's batch-sharded sampling


def _batch_sharded_worker(rank, world_size, seed, batch, vocab):
    import torch.distributed as dist

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, 24, generator=g)
    weight = torch.randn(vocab, 24, generator=g) * 0.01
    winners = torch.randperm(vocab, generator=g)[:batch]
    weight[winners] = 8 * hidden / (hidden * hidden).sum(dim=1, keepdim=True)  # logit 8 against ~0: clear
    w, _, s = make_shards(weight, None, world_size, 16, hidden=hidden, pad="huge")[rank]  # padding that would win
    kw = dict(vocab_start=s.vocab_start, num_valid=s.num_valid, group=dist.group.WORLD)
    greedy = filtered.batch_sharded_sample(hidden, w, temperature=0.0, **kw)
    top1 = filtered.batch_sharded_sample(hidden, w, temperature=0.8, top_k=1, **kw)  # top-k 1: the argmax again
    drawn = filtered.batch_sharded_sample(
        hidden, w, temperature=50.0, generator=torch.Generator().manual_seed(seed + rank), **kw
    )
    return winners.tolist(), greedy.tolist(), top1.tolist(), drawn.tolist()


@pytest.mark.parametrize("tp, batch", [(2, 7), (3, 2), (3, 10)])
def test_batch_sharded_sample_routes_every_row_to_its_owner_and_back(tp, batch):
    """The all-to-all baseline on gloo ranks, uneven vocab (103 rows) with padding that would win:
    greedy and top-k 1 return each row's planted winner in batch order on every rank (rows owned
    by other ranks, batches smaller than tp and not divisible by it); a hot draw (T = 50) is the
    same on every rank and never padding."""
    results = run_ranks(_batch_sharded_worker, tp, SEED, batch, 103)
    for winners, greedy, top1, drawn in results:
        assert greedy == winners and top1 == winners
        assert drawn == results[0][3] and all(0 <= i < 103 for i in drawn)
    assert any(r[3] != r[0] for r in results[:1]), "T = 50 drew the winners: the draw is not random"


def test_batch_sharded_bytes_count_the_plan():
    """Rank r owns rows r, r + tp, ...; it sends the logits of the rows it does not own and one
    int64 per owned slot (ceil(B / tp)) to the gather; receives tp - 1 blocks of its own rows."""
    assert [filtered.owned_rows(7, 3, r) for r in range(3)] == [3, 2, 2]
    assert filtered.batch_sharded_bytes(7, 100, 2, 3, rank=0) == ((7 - 3) * 200 + 24, 2 * 3 * 200 + 2 * 24)
    assert filtered.batch_sharded_bytes(7, 100, 2, 3, rank=2) == ((7 - 2) * 200 + 24, 2 * 2 * 200 + 2 * 24)
    assert filtered.batch_sharded_bytes(5, 100, 4, 1) == (0, 0)
    for tp in (
        2,
        4,
        8,
    ):  # the all-to-all delivers what it sends (the ids' all-gather: sent once, received tp - 1 times)
        ids = 8 * -(-13 // tp)
        sent = sum(filtered.batch_sharded_bytes(13, 64, 2, tp, r)[0] - ids for r in range(tp))
        assert sent == sum(filtered.batch_sharded_bytes(13, 64, 2, tp, r)[1] - (tp - 1) * ids for r in range(tp))
