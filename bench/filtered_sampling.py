"""Filtered sampling (issue 49; DESIGN.md, "Filtered sampling"): a sweep over
common SamplingParams of what ``localargmax-bench --op sample --top-k/--top-p/
--min-p`` measures in one run (the shared code: localargmax/bench/filtered.py):
the share of rows whose allowed set the candidates do not decide (the fallback), bytes per
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
import statistics
import sys
import time

import torch

import localargmax
from localargmax.bench import data, filtered
from localargmax.bench.filtered import SETTINGS
from localargmax.bench.report import cpu_name


def machine() -> dict:
    """The CPU's model name and torch's version (for the record)."""
    return {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__}


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
            share = filtered.fallback_share(hidden, weight, tp, t, k, p, mp)
            shard_rows = -(-vocab // tp)
            row[f"tp{tp}"] = {
                "fallback_share": share,
                "bytes_per_rank": filtered.filtered_bytes(b, round(share * b), shard_rows),
                "gather_bytes_per_rank": 4 * b * shard_rows,
            }
        if not args.no_time:
            kw = dict(temperature=t, seed=1, top_k=k, top_p=p, min_p=mp)
            gen = torch.Generator().manual_seed(0)
            row["time_s_tp1"] = {
                "ours": timed(lambda: localargmax.lm_head_sample(hidden, weight, **kw), args.repeat),
                "gather_filter_sample": timed(
                    lambda: filtered.gather_filter_sample(hidden, weight, **kw, generator=gen), args.repeat
                ),
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
