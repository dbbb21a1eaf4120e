"""Side by side with FlashSampling (arXiv 2603.15854): its baselines written in
torch, its published H200 figures, the roofline yardsticks and the plot of the
``--kernel-only`` rows.

Baselines (each a function ``(hidden, weight) -> ids``, logits materialised):

* ``gumbel-logits``: torch matmul -> float32 logits -> Gumbel-max on the
  logits, ``argmax(logits / T + g)`` with ``g = -log(-log(u))``, ``u`` from
  torch's generator (``torch.rand_like``; under ``torch.compile`` inductor's
  Philox stream seeded from it). FlashSampling's "FI2" path, in torch.
* ``compiled-multinomial``: matmul -> ``softmax(logits.float() / T)`` ->
  ``torch.multinomial``, compiled (FlashSampling's "compiled torch" baseline).
* ``flashinfer``: cuBLAS logits (torch matmul) ->
  ``flashinfer.sampling.sampling_from_logits`` on ``logits / T``: FI2 itself,
  when ``flashinfer`` imports on a CUDA device; otherwise a row with
  ``skip_reason``.
* ``torch-matmul-max`` / ``torch-matmul-topk``: matmul + ``max`` / ``topk``.

``T == 0`` is greedy for every sampling baseline (argmax of the logits).

Published figures (:data:`PUBLISHED`): FlashSampling's kernel speedup over a
baseline on an H200 in bf16, for its two shapes at tp 1. A row of ours gets
``flashsampling_h200[column] = {"ratio", "source", "baseline"}`` exactly for
the (shape, batch, baseline) cells the paper gives; nothing is interpolated.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

FI2_SOURCE = (
    "FlashSampling (arXiv 2603.15854, 2026), Tables 4 (D=4096, V=151,936) and 5 (D=8192, V=128,256): "
    "kernel speedup of FlashSampling over FI2 = cuBLAS logits + FlashInfer sampling_from_logits "
    "(Gumbel-max), H200, bf16, median of 100 iterations"
)
MULTINOMIAL_SOURCE = (
    "FlashSampling (arXiv 2603.15854, 2026): speedup over compiled torch matmul + softmax + "
    "multinomial, H200, bf16, D=4096 (V=151,936): 1.35 at B=1, 1.67 at B=64, 1.22 at B=256"
)

PUBLISHED: dict[tuple[int, int], dict[str, dict[int, float]]] = {
    (151936, 4096): {
        "FI2": {1: 1.24, 8: 1.24, 16: 1.25, 32: 1.27, 64: 1.25, 128: 0.94, 256: 0.79},
        "compiled torch softmax+multinomial": {1: 1.35, 64: 1.67, 256: 1.22},
    },
    (128256, 8192): {"FI2": {1: 1.13, 8: 1.12, 16: 1.13, 32: 1.18, 64: 1.20, 128: 0.78, 256: 0.65}},
}
"""(vocab, hidden) -> published baseline -> batch -> FlashSampling's H200 speedup
(sampling, tp 1, bf16). Only the cells the paper states."""

PUBLISHED_SOURCES = {"FI2": FI2_SOURCE, "compiled torch softmax+multinomial": MULTINOMIAL_SOURCE}

# Our baseline method -> (speedup column, table title, FlashSampling's baseline it stands for or None)
BASELINES = {
    "torch-matmul-max": ("speedup_vs_torch", "vs_torch", None),
    "torch-matmul-topk": ("speedup_vs_torch", "vs_torch", None),
    "gumbel-logits": ("speedup_vs_gumbel_logits", "vs_gumbel", "FI2"),
    "compiled-multinomial": ("speedup_vs_multinomial", "vs_multinom", "compiled torch softmax+multinomial"),
    "flashinfer": ("speedup_vs_flashinfer", "vs_flashinfer", "FI2"),
    "vllm-gumbel-logits": ("speedup_vs_vllm_gumbel", "vs_vllm", None),
}

OP_BASELINES = {
    "argmax": ("torch-matmul-max",),
    "topk": ("torch-matmul-topk",),
    "sample": ("gumbel-logits", "compiled-multinomial", "flashinfer"),
}
"""The baselines timed for each ``--op`` in ``--kernel-only``, in table order."""

OUR_METHODS = ("fused-kernel", "lm-head-step", "fused-simt", "fused-mma", "gemm-keys")
"""Rows of ours, which get ratios over the baselines and the published figures."""

DEFAULT_KERNEL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def published_cells(vocab: int, hidden: int, tp: int | None, batch: int | None, op: str) -> dict[str, dict]:
    """``{speedup column: {"ratio", "source", "baseline"}}`` of FlashSampling's
    published H200 figures for this (shape, tp, batch, op); ``{}`` where the
    paper gives none (other shapes, tp > 1, argmax / topk, batches it skips)."""
    table = PUBLISHED.get((vocab, hidden))
    if op != "sample" or tp != 1 or table is None or batch is None:
        return {}
    cells = {}
    for method in OP_BASELINES["sample"]:
        column, _, theirs = BASELINES[method]
        ratio = table.get(theirs, {}).get(batch) if theirs else None
        if ratio is not None:
            cells[column] = {"ratio": ratio, "baseline": theirs, "source": PUBLISHED_SOURCES[theirs]}
    return cells


def published_summary(rows: list[dict]) -> str | None:
    """A line with FlashSampling's published H200 figures for the run's shape
    when none of the rows is a cell the paper gives (e.g. only tp > 1 shards
    were timed): the full-head (tp 1) figures, marked as not the same cell.
    None when the paper has no figure for the shape or op."""
    sample = [r for r in rows if r.get("op") == "sample" and r.get("batch") is not None]
    if not sample:
        return None
    table = PUBLISHED.get((sample[0]["vocab"], sample[0]["hidden"]))
    if table is None:
        return None
    parts = [
        f"vs {name}: " + ", ".join(f"B={b} {x:.2f}" for b, x in sorted(cells.items())) for name, cells in table.items()
    ]
    return (
        f"FlashSampling's published H200 bf16 speedups for the full {sample[0]['shape']} head (tp 1; not the "
        f"shards timed here, so not beside our rows): " + "; ".join(parts) + " (arXiv 2603.15854, Tables 4-5)"
    )


# ------------------------------------------------------------------ baselines


def gumbel_logits_sample(hidden: torch.Tensor, weight: torch.Tensor, inv_t: float) -> torch.Tensor:
    """``argmax(logits * inv_t + g)`` over the materialised float32 logits,
    ``g`` standard Gumbel from torch's generator; ``inv_t = 1 / T`` (``0``
    for T = 0: greedy, no noise)."""
    logits = (hidden @ weight.T).float()
    if inv_t == 0:
        return logits.argmax(dim=1)
    u = torch.rand_like(logits)
    return torch.argmax(logits * inv_t - torch.log(-torch.log(u)), dim=1)


def vllm_gumbel_logits_sample(hidden: torch.Tensor, weight: torch.Tensor, temperature: torch.Tensor, noise):
    """vLLM 0.34's ``gumbel_sample`` on a shard's materialised logits: logits
    in the weight dtype (vLLM's lm_head), ``fl(x / T) + g`` in float32 with
    vLLM's noise (:func:`localargmax.vllm_gumbel_noise` at the shard's ids),
    the first maximum; ``temperature`` ``[B]`` float32 (``0``: greedy)."""
    from ..sampling.noise import vllm_gumbel_noise

    x = (hidden @ weight.T).float()
    random = temperature != 0
    y = torch.where(random[:, None], x / torch.where(random, temperature, 1.0)[:, None], x)
    ids = torch.arange(x.shape[1], device=x.device)[None]
    g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids)
    return torch.where(random[:, None], y + g, y).argmax(dim=1)


def multinomial_sample(hidden: torch.Tensor, weight: torch.Tensor, inv_t: float) -> torch.Tensor:
    """``multinomial(softmax(logits.float() * inv_t), 1)`` (``inv_t = 0``: argmax)."""
    logits = (hidden @ weight.T).float()
    if inv_t == 0:
        return logits.argmax(dim=1)
    return torch.multinomial(torch.softmax(logits * inv_t, dim=1), 1).squeeze(1)


def flashinfer_sampler() -> tuple[Callable | None, str | None]:
    """``(fn, None)`` with ``fn(hidden, weight, inv_t) -> ids`` using
    FlashInfer's ``sampling_from_logits``, or ``(None, skip reason)``."""
    try:
        from flashinfer.sampling import sampling_from_logits
    except Exception as exc:  # noqa: BLE001  ImportError, or a broken install
        return None, f"flashinfer not importable ({type(exc).__name__}: {exc})"[:200]

    def fn(hidden, weight, inv_t):
        logits = hidden @ weight.T
        if inv_t == 0:
            return logits.argmax(dim=1)
        return sampling_from_logits(logits * inv_t if inv_t != 1 else logits)

    return fn, None


def maybe_compile(fn: Callable, enabled: bool) -> CompileOnce:
    """``fn`` under ``torch.compile(dynamic=True)`` when ``enabled``, falling
    back to eager ``fn`` if compiling fails at a call; ``.note`` says which ran."""
    return CompileOnce(fn, enabled)


class CompileOnce:
    """Callable: the compiled ``fn``, or ``fn`` itself after compiling failed."""

    def __init__(self, fn: Callable, enabled: bool = True):
        self.fn = fn
        self.__name__ = fn.__name__
        self.compiled = torch.compile(fn, dynamic=True) if enabled else None
        self.note: str = "compiled" if enabled else "eager (--no-compile)"

    def __call__(self, *args):
        if self.compiled is None:
            return self.fn(*args)
        try:
            return self.compiled(*args)
        except Exception as exc:  # noqa: BLE001  inductor / dynamo errors vary
            self.compiled = None
            self.note = f"eager: torch.compile failed ({type(exc).__name__})"
            print(f"  torch.compile of {self.fn.__name__} failed, timing it eagerly: {exc}"[:300], file=sys.stderr)
            return self.fn(*args)


# ----------------------------------------------------------------- yardsticks


def gemm_shape(device: torch.device) -> int:
    """Side of the square GEMM that measures the dtype's matmul rate: 8192 on
    CUDA, 1024 on CPU (2.1 GFLOP; a few calls fit in seconds)."""
    return 8192 if device.type == "cuda" else 1024


def roofline_us(nbytes: int, flops: float, read_gbps: float, gemm_tflops: float) -> float:
    """``max(bytes / read bandwidth, flops / GEMM rate)`` in microseconds."""
    return max(nbytes / (read_gbps * 1e3), flops / (gemm_tflops * 1e6))


def step_flops(batch: int, rows: int, hidden: int) -> float:
    """Multiply-adds of the ``[batch, hidden] x [rows, hidden]^T`` product, x2."""
    return 2.0 * batch * rows * hidden


# ----------------------------------------------------------------------- plot


def plot_kernel_rows(rows: list[dict], path: str, device_label: str) -> str | None:
    """Time vs batch per method, one panel per (shape, tp), with the roofline
    of each shard (dashed) and the stream-read time (dotted); written to
    ``path``. Returns None, or why no plot was written (no matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install matplotlib, or .[bench])"
    panels = sorted(
        {(r["shape"], r["tp"], r["rows"]) for r in rows if r.get("batch") is not None}, key=lambda p: (p[0], p[1] or 0)
    )
    if not panels:
        return "no timed rows"
    cols = min(2, len(panels))
    fig, axes = plt.subplots(
        -(-len(panels) // cols), cols, figsize=(6.5 * cols, 4.5 * -(-len(panels) // cols)), squeeze=False
    )
    for ax, (shape, tp, nrows) in zip(axes.flat, panels):
        mine = [r for r in rows if r["shape"] == shape and r["tp"] == tp and r["rows"] == nrows]
        methods = [m for m in dict.fromkeys(r["method"] for r in mine if r.get("batch") is not None)]
        for method in methods:
            pts = sorted(
                (r["batch"], r["median_us"])
                for r in mine
                if r["method"] == method and r.get("median_us") is not None and r.get("batch") is not None
            )
            if pts:
                style = "-o" if method in OUR_METHODS else "--s"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=method, markersize=4)
        roof = sorted({(r["batch"], r["roofline_us"]) for r in mine if r.get("roofline_us") is not None})
        if roof:
            ax.plot([p[0] for p in roof], [p[1] for p in roof], "k--", linewidth=1.5, label="roofline")
        stream = [r for r in mine if r["method"] == "stream-read" and r.get("median_us")]
        if stream:
            ax.axhline(stream[0]["median_us"], color="grey", linestyle=":", label="stream-read")
        ax.set_xscale("log", base=2)
        batches = sorted({r["batch"] for r in mine if r.get("batch") is not None})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel(f"median µs ({device_label})")
        ax.set_title(f"{shape} tp={tp} shard [{nrows}, {mine[0]['hidden']}] {mine[0]['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"--kernel-only --op {rows[0].get('op', 'argmax')}: time vs batch, {device_label} figures")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def plot_path(json_path: str | None) -> str | None:
    """The PNG beside a JSON file (``x.json`` -> ``x.png``); None for stdout / none."""
    if not json_path or json_path == "-":
        return None
    root, _ = os.path.splitext(json_path)
    return root + ".png"


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square statistic of ``counts`` against ``probs`` (cells
    with expected count < 5 pooled into one)."""
    n = float(counts.sum())
    expected = probs.double() * n
    small = expected < 5
    obs = counts.double()
    if bool(small.any()):
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        obs = torch.cat([obs[~small], obs[small].sum().reshape(1)])
    return float(((obs - expected) ** 2 / expected).sum())
