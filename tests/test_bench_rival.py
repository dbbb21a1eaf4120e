"""The FlashSampling side-by-side rows of ``--kernel-only`` (localargmax.bench.rival):
each baseline is right, the published figures sit in exactly the cells that
have one, the roofline columns follow their definition, and the CLI writes
them (tiny CPU shapes)."""

import importlib.util

import pytest
import torch

from localargmax.bench import rival
from localargmax.bench.kernel import annotate
from localargmax.bench.report import format_table, kernel_legend
from tests.support.launch import kernel_smoke

# chi-square critical value for 7 degrees of freedom at p = 1e-4 (scipy.stats.chi2.isf(1e-4, 7));
# the draws come from fixed seeds, so each check is deterministic.
CHI2_7DF_P1E4 = 29.88
VOCAB, DRAWS = 8, 40000


def tiny_head(seed=0):
    """hidden [DRAWS, 4] (one row repeated: every row draws from the same
    distribution) and weight [VOCAB, 4] with moderate logits (every cell
    expects > 5 draws, so no cells are pooled)."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(1, 4, generator=gen)
    w = torch.randn(VOCAB, 4, generator=gen) * 0.6
    return h.expand(DRAWS, 4).contiguous(), w


@pytest.mark.parametrize("fn", [rival.gumbel_logits_sample, rival.multinomial_sample], ids=["gumbel", "multinomial"])
@pytest.mark.parametrize("compile_it", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.5])
def test_sampling_baselines_follow_softmax(fn, compile_it, temperature):
    h, w = tiny_head()
    logits = (h[:1] @ w.T).double()[0]
    probs = torch.softmax(logits / temperature, dim=0)
    assert float(probs.min()) * DRAWS > 5
    torch.manual_seed(1234)
    sampler = rival.maybe_compile(fn, compile_it)
    ids = sampler(h, w, 1.0 / temperature)
    assert sampler.note == ("compiled" if compile_it else "eager (--no-compile)")
    assert ids.shape == (DRAWS,) and ids.dtype == torch.int64
    counts = torch.bincount(ids, minlength=VOCAB)
    assert rival.chi_square(counts, probs) < CHI2_7DF_P1E4, (counts.tolist(), (probs * DRAWS).tolist())


def test_sampling_baselines_are_not_uniform_or_greedy():
    """The chi-square test has power: draws from the wrong temperature fail it."""
    h, w = tiny_head()
    logits = (h[:1] @ w.T).double()[0]
    torch.manual_seed(1234)
    counts = torch.bincount(rival.gumbel_logits_sample(h, w, 1.0), minlength=VOCAB)
    assert rival.chi_square(counts, torch.softmax(logits / 2.5, dim=0)) > CHI2_7DF_P1E4


@pytest.mark.parametrize("fn", [rival.gumbel_logits_sample, rival.multinomial_sample])
def test_temperature_zero_is_exact_argmax(fn):
    gen = torch.Generator().manual_seed(3)
    h, w = torch.randn(16, 32, generator=gen), torch.randn(300, 32, generator=gen)
    w[7] = w[200]  # an exact tie: the smaller index wins, as torch.argmax
    assert torch.equal(fn(h, w, 0.0), (h @ w.T).argmax(dim=1))


def test_flashinfer_is_a_skip_reason_when_missing():
    fn, why = rival.flashinfer_sampler()
    if importlib.util.find_spec("flashinfer") is None:
        assert fn is None and "flashinfer not importable" in why
    else:
        assert (fn is None) != (why is None)


# ----------------------------------------------------------- published cells

QWEN3, LLAMA70 = (151936, 4096), (128256, 8192)


def test_published_cells_exactly_where_the_paper_gives_one():
    cells = rival.published_cells(*QWEN3, tp=1, batch=1, op="sample")
    assert {c: v["ratio"] for c, v in cells.items()} == {
        "speedup_vs_gumbel_logits": 1.24,
        "speedup_vs_flashinfer": 1.24,
        "speedup_vs_multinomial": 1.35,
    }
    for cell in cells.values():
        assert "arXiv 2603.15854" in cell["source"] and "H200" in cell["source"]
    assert cells["speedup_vs_multinomial"]["baseline"] == "compiled torch softmax+multinomial"
    assert cells["speedup_vs_gumbel_logits"]["baseline"] == "FI2"
    assert set(rival.published_cells(*QWEN3, tp=1, batch=128, op="sample")) == {
        "speedup_vs_gumbel_logits",
        "speedup_vs_flashinfer",
    }
    assert rival.published_cells(*QWEN3, tp=1, batch=256, op="sample")["speedup_vs_multinomial"]["ratio"] == 1.22
    assert rival.published_cells(*LLAMA70, tp=1, batch=256, op="sample")["speedup_vs_flashinfer"]["ratio"] == 0.65
    assert "speedup_vs_multinomial" not in rival.published_cells(*LLAMA70, tp=1, batch=1, op="sample")
    for args in [
        (*QWEN3, 1, 2, "sample"),
        (*QWEN3, 1, 4, "sample"),
        (*QWEN3, 2, 64, "sample"),
        (*QWEN3, None, 64, "sample"),
        (*QWEN3, 1, 64, "argmax"),
        (*QWEN3, 1, 64, "topk"),
        (128256, 4096, 1, 64, "sample"),
        (*QWEN3, 1, 512, "sample"),
    ]:
        assert rival.published_cells(*args) == {}, args


def fake_rows(vocab, hidden, tp, rows, batches, op="sample"):
    """Rows as run_kernel_only makes them, with made-up medians."""
    common = dict(
        model="qwen3",
        shape=f"s{vocab}",
        vocab=vocab,
        hidden=hidden,
        dtype="bfloat16",
        device="cpu",
        op=op,
        tp=tp,
        rows=rows,
    )
    nbytes = rows * hidden * 2

    def row(method, batch, median, weight_bytes=nbytes, **extra):
        return dict(
            common,
            method=method,
            batch=batch,
            median_us=median,
            weight_bytes=weight_bytes,
            gbps=weight_bytes / (median * 1e-6) / 1e9 if median else None,
            **extra,
        )

    out = [row("stream-read", None, 100.0), row("d2d-copy", None, 150.0, 2 * nbytes)]
    for b in batches:
        out += [
            row("gumbel-logits", b, 400.0),
            row("compiled-multinomial", b, 500.0),
            dict(row("flashinfer", b, None), skip_reason="CUDA only"),
            row("fused-kernel", b, 200.0),
            row("lm-head-step", b, 250.0),
        ]
    return out


# The tensor-core yardstick row of a CPU run (0.5 TFLOP/s), for annotate()'s roofline.
GEMM_ROW = dict(
    method="gemm-peak", shape="gemm", tp=None, rows=None, batch=None, median_us=1.0, tflops=0.5, gbps=None,
    weight_bytes=0, device="cpu",
)  # fmt: skip


def test_annotate_ratios_roofline_and_published_cells():
    rows = [GEMM_ROW] + fake_rows(*QWEN3, 1, 151936, [1, 2, 256]) + fake_rows(*QWEN3, 8, 18992, [1, 256])
    annotate(rows, "sample")
    for r in rows[1:]:
        if r["method"] in ("stream-read", "d2d-copy") or r.get("median_us") is None:
            assert "flashsampling_h200" not in r
            continue
        bytes_us = r["weight_bytes"] / (rows_stream_gbps(rows, r) * 1e3)
        flops_us = 2 * r["batch"] * r["rows"] * r["hidden"] / (0.5 * 1e6)
        assert r["roofline_us"] == pytest.approx(max(bytes_us, flops_us))
        assert r["fraction_of_roofline"] == pytest.approx(r["roofline_us"] / r["median_us"])
        assert r["speedup_vs_gumbel_logits"] == pytest.approx(400.0 / r["median_us"])
        assert r["speedup_vs_multinomial"] == pytest.approx(500.0 / r["median_us"])
        assert "speedup_vs_flashinfer" not in r  # skipped baseline: no ratio
        if r["method"] not in rival.OUR_METHODS:
            assert "flashsampling_h200" not in r
            continue
        expected = rival.published_cells(r["vocab"], r["hidden"], r["tp"], r["batch"], "sample")
        assert r["flashsampling_h200"] == expected
        assert bool(expected) == (r["tp"] == 1 and r["batch"] in (1, 256))
    table = format_table(rows, kernel_only=True)
    header = table.splitlines()[0].split()
    assert {"of_roof", "vs_gumbel", "FS_gumbel", "vs_multinom", "FS_multinom", "FS_flashinfer", "note"} <= set(header)
    assert "H200" in kernel_legend(rows) and "CPU" in kernel_legend(rows)


def rows_stream_gbps(rows, r):
    return next(x["gbps"] for x in rows if x["method"] == "stream-read" and x["tp"] == r["tp"])


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_plot_is_written(tmp_path):
    rows = [dict(GEMM_ROW, hidden=4096, dtype="bfloat16")] + fake_rows(*QWEN3, 1, 151936, [1, 2, 256])
    annotate(rows, "sample")
    path = tmp_path / "x.png"
    assert rival.plot_kernel_rows(rows, str(path), "CPU") is None
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert rival.plot_path("a/b.json") == "a/b.png" and rival.plot_path("-") is None


# ------------------------------------------------------------------- the CLI


def test_kernel_only_sample_rows(tmp_path):
    proc, rows, out = kernel_smoke(tmp_path, "--op", "sample", "--temperature", "0.7", "--tp", "1,2", "--no-compile")
    assert "our figures: CPU" in proc.stdout
    bounds = {(tp, m) for tp in (1, 2) for m in ("stream-read", "d2d-copy")} | {(None, "gemm-peak")}
    assert {(r["tp"], r["method"]) for r in rows if r["batch"] is None} == bounds
    timed = [r for r in rows if r["batch"] is not None]
    assert {r["method"] for r in timed} == set(
        "gumbel-logits compiled-multinomial flashinfer fused-kernel lm-head-step".split()
    )
    assert {(r["tp"], r["batch"]) for r in timed} == {(1, 1), (1, 4), (2, 1), (2, 4)}
    assert {r["rows"] for r in timed if r["tp"] == 2} == {512}  # rank 0 of 1003 rows padded to 1024, tp 2
    for r in timed:
        assert r["op"] == "sample" and r["temperature"] == 0.7
        if r["method"] == "flashinfer":
            assert r["median_us"] is None and r["skip_reason"]
            continue
        assert r["median_us"] > 0 and 0 < r["fraction_of_roofline"] and r["roofline_us"] > 0
        assert r["speedup_vs_gumbel_logits"] > 0 and r["speedup_vs_multinomial"] > 0
        if r["method"] in ("gumbel-logits", "compiled-multinomial"):
            assert r["note"] == "eager (--no-compile)"
        else:
            assert r["flashsampling_h200"] == {}  # a tiny synthetic shape: the paper has no cell
    assert out.with_suffix(".png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_kernel_only_sample_with_vllms_noise(tmp_path):
    """--noise vllm: the fused rows draw vLLM's noise and agree with the
    vllm-gumbel-logits baseline (vLLM's gumbel_sample on the shard's
    logits, the same noise) on every row; greedy rows too."""
    for t in ("0.7", "0"):
        proc, rows, _ = kernel_smoke(tmp_path, "--op", "sample", "--temperature", t, "--noise", "vllm", "--no-compile")
        assert "noise=vllm" in proc.stdout and "agree_vllm" in proc.stdout
        timed = [r for r in rows if r["batch"] is not None and r["median_us"] is not None]
        assert "vllm-gumbel-logits" in {r["method"] for r in timed}
        ours = [r for r in timed if r["method"] in ("fused-kernel", "lm-head-step")]
        assert len(ours) == 4
        for r in ours:
            assert r["noise"] == "vllm" and r["agree_vllm"] == 1.0, r
            assert r["speedup_vs_vllm_gumbel"] > 0


@pytest.mark.parametrize("op", ["argmax", "topk"])
def test_kernel_only_argmax_and_topk_are_exact(tmp_path, op):
    _, rows, _ = kernel_smoke(tmp_path, "--op", op, *(["--k", "4"] if op == "topk" else []))
    baseline = "torch-matmul-max" if op == "argmax" else "torch-matmul-topk"
    timed = [r for r in rows if r["batch"] is not None]
    assert {r["method"] for r in timed} == {baseline, "fused-kernel", "lm-head-step"}
    for r in timed:
        assert r["agree"] == 1.0, r
        assert r["speedup_vs_torch"] > 0 and r["fraction_of_roofline"] > 0
        assert r.get("flashsampling_h200", {}) == {}


def test_legend_quotes_the_full_head_figures_when_only_shards_were_timed():
    rows = [GEMM_ROW] + fake_rows(*QWEN3, 8, 18992, [1, 256])
    annotate(rows, "sample")
    assert not any(r.get("flashsampling_h200") for r in rows)
    legend = kernel_legend(rows)
    assert "not the shards timed here" in legend and "B=256 0.79" in legend and "B=64 1.67" in legend
    assert "FS_gumbel" not in format_table(rows, kernel_only=True)
    assert rival.published_summary(fake_rows(1003, 64, 1, 1003, [1])) is None
