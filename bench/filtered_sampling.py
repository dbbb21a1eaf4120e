"""Filtered sampling (issue 49; DESIGN.md, "Filtered sampling"): the share of
rows whose allowed set the candidates do not decide (the fallback), bytes per
rank against the full gather, and the time of one rank's step against full
logits + a vLLM-style filter + sample, at common SamplingParams.

    PYTHONPATH=. python bench/filtered_sampling.py --model minilm --batch 64 --tp 1 2 8
    PYTHONPATH=. python bench/filtered_sampling.py --model qwen3 --batch 16 --tp 8

Ranks are simulated in one process (each shard's fused top-64 pass, the
merge and the decision of localargmax.sampling); time is tp 1 (the whole
vocabulary on one rank), median of ``--repeat`` calls. Writes JSON to
bench/results/filtered_sampling_<model>.json with the command and the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch

import localargmax
from localargmax import sampling
from localargmax.bench import data

SETTINGS = [  # (T, top_k, top_p, min_p): common vLLM SamplingParams
    (0.7, 0, 0.9, 0.0), (1.0, 0, 0.9, 0.0), (0.7, 0, 0.95, 0.0), (1.0, 0, 0.95, 0.0),
    (1.0, 20, 1.0, 0.0), (1.0, 50, 1.0, 0.0), (0.7, 50, 0.95, 0.0), (1.0, 0, 1.0, 0.05),
    (0.7, 20, 0.8, 0.05),
]  # fmt: skip


def fallback_share(hidden, weight, tp, t, k, p, mp) -> float:
    """Share of rows the merged candidates of ``tp`` shards do not decide."""
    keys, pairs = [], []
    for r in range(tp):
        s = localargmax.shard_vocab(weight.shape[0], r, tp)
        kk, pp = localargmax.shard_topk(
            hidden, weight[s.vocab_start : s.vocab_start + s.num_valid].contiguous(), sampling.CANDIDATES,
            vocab_start=s.vocab_start, log_partition=True,
        )  # fmt: skip
        keys.append(kk)
        pairs.append(pp)
    b = hidden.shape[0]
    full = lambda v, dt: torch.full((b,), v, dtype=dt)  # noqa: E731
    rows = torch.arange(b)
    _, _, need = sampling._decide(
        torch.stack(keys), torch.stack(pairs), full(t, torch.float32), full(k, torch.int64),
        full(p, torch.float64), full(mp, torch.float64), 1, rows, False,
    )  # fmt: skip
    return float(need.float().mean())


def vllm_style(hidden, weight, t, k, p, mp, gen):
    """The gather baseline after the gather: float32 logits, temperature,
    min-p, top-k / top-p by a sort (apply_top_k_top_p_pytorch's method),
    exponential-race sampling."""
    y = (hidden @ weight.T) / t
    if mp > 0:
        y = y.masked_fill(y < y.max(dim=1, keepdim=True).values + math.log(mp), -math.inf)
    if k > 0 or p < 1:
        ys, idx = y.sort(dim=1)
        if k > 0:
            ys = ys.masked_fill(ys < ys[:, -k : -k + 1], -math.inf)
        if p < 1:
            mask = ys.softmax(dim=1).cumsum(dim=1) <= 1 - p
            mask[:, -1] = False
            ys = ys.masked_fill(mask, -math.inf)
        y = y.scatter(1, idx, ys)
    q = torch.empty_like(y).exponential_(generator=gen)
    return (y.softmax(dim=1) / q).argmax(dim=1)


def machine() -> dict:
    """The CPU's model name and torch's version (for the record)."""
    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    cpu = names[0] if names else platform.machine()
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__}


def timed(fn, repeat) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("minilm", "qwen3"), default="minilm")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-time", action="store_true", help="fallback shares and bytes only")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    if args.model == "minilm":
        shape = data.minilm_shapes(0, args.batch)[0]
        weight = shape.weight
    else:
        shape = data.synthetic_shape("qwen3", None, None, 0)
        weight = torch.cat([rows for _, rows in shape.blocks(0, shape.vocab)])
    hidden = shape.hidden_states(args.batch)
    vocab, b = weight.shape[0], args.batch
    rows = []
    for t, k, p, mp in SETTINGS:
        row = {"temperature": t, "top_k": k, "top_p": p, "min_p": mp}
        for tp in args.tp:
            share = fallback_share(hidden, weight, tp, t, k, p, mp)
            shard_rows = -(-vocab // tp)
            ours = 8 * localargmax.payload_length(b, sampling.CANDIDATES, True)
            fb = 8 * sampling.fallback_payload_length(round(share * b), shard_rows) if share else 0
            row[f"tp{tp}"] = {
                "fallback_share": share,
                "bytes_per_rank": ours + fb,
                "gather_bytes_per_rank": 4 * b * shard_rows,
            }
        if not args.no_time:
            kw = dict(temperature=t, seed=1, top_k=k, top_p=p, min_p=mp)
            gen = torch.Generator().manual_seed(0)
            row["time_s_tp1"] = {
                "ours": timed(lambda: localargmax.lm_head_sample(hidden, weight, **kw), args.repeat),
                "gather_filter_sample": timed(lambda: vllm_style(hidden, weight, t, k, p, mp, gen), args.repeat),
            }
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {
        "kind": "filtered",
        "command": "PYTHONPATH=. python bench/filtered_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "model": args.model,
        "vocab": vocab,
        "hidden": weight.shape[1],
        "batch": b,
        "rows": rows,
    }
    path = f"bench/results/filtered_sampling_{args.model}.json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
