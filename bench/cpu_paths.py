"""Side-by-side timing of the CPU kernel's paths (DESIGN.md, "CPU paths"):
``localargmax.shard_argmax(hidden, weight, path=NAME)`` on one shard for every
path this CPU has, the paths interleaved within each round so that other load
on the machine falls on all of them alike; median over rounds x steps. The
name ``torch`` in --paths times torch's matmul + max over the shard (the
benchmark CLI's torch-matmul-max row) in the same rounds. Each row also has
its GFLOP/s (2·B·rows·H per call, at the median) and that as a fraction of
the core's measured FMA peak, also at the fastest call (``_at_min``: on a
shared machine the median includes time the core ran other work): a tight
float32 FMA loop (``localargmax._C._fma_peak``, the widest of zmm / ymm this
CPU has), fastest of 4 short tries once per round; its median over the
rounds is ``env.fma_peak_gflops``, with the load average.

    PYTHONPATH=. python bench/cpu_paths.py --rows 75968 --hidden 4096 --dtype bfloat16 \
        --batch 1,8,64 --threads 2 --json bench/results/cpu_kinds/<file>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import localargmax
from localargmax.bench.report import cpu_paths_available, env_info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=75968)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--batch", default="1,8,64", help="comma-separated batch sizes")
    ap.add_argument("--paths", default=None, help="comma-separated CPU paths (default: every path this CPU has)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed calls per path per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    paths = args.paths.split(",") if args.paths else cpu_paths_available()
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(args.rows, args.hidden, generator=gen) / args.hidden**0.5).to(dtype)
    peak_isa = "avx512" if "avx512" in cpu_paths_available() else "avx2" if "avx2" in cpu_paths_available() else None
    peaks: list[float] = []

    def measure_peak():
        if peak_isa is not None:  # ~10 ms, 4 tries, the fastest
            peaks.append(max(localargmax._C._fma_peak(peak_isa, 100_000) for _ in range(4)) / 1e9)

    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        hidden = torch.randn(batch, args.hidden, generator=gen).to(dtype)

        def call(p):
            if p == "torch":  # ids (not keys): compared by id below
                return torch.matmul(hidden, weight.T).max(dim=1).indices
            return localargmax.shard_argmax(hidden, weight, path=p)

        keys = {p: call(p) for p in paths}  # warm-up, and the ids
        times: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(args.rounds):
            measure_peak()
            for p in paths:
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    call(p)
                    times[p].append(time.perf_counter() - t0)
        peak = statistics.median(peaks) if peaks else None
        flops = 2.0 * batch * args.rows * args.hidden
        base = statistics.median(times[paths[0]])
        for p in paths:
            med = statistics.median(times[p])
            if "torch" in (p, paths[0]):  # torch gives ids: compare the ids
                a, b = (keys[q] if q == "torch" else localargmax.decode_keys(keys[q])[0] for q in (p, paths[0]))
                same = bool(torch.equal(a, b))
            else:
                same = bool(torch.equal(keys[p], keys[paths[0]]))
            rows.append(
                dict(
                    path=p,
                    batch=batch,
                    dtype=args.dtype,
                    rows=args.rows,
                    hidden=args.hidden,
                    median_us=med * 1e6,
                    min_us=min(times[p]) * 1e6,
                    samples=len(times[p]),
                    speedup_vs_first=base / med,
                    keys_equal_first=same,
                    gflops=flops / med / 1e9,
                    fraction_of_fma_peak=flops / med / 1e9 / peak if peak else None,
                    fraction_of_fma_peak_at_min=flops / min(times[p]) / 1e9 / peak if peak else None,
                )
            )
            frac = (
                f"  {flops / med / 1e9 / peak:4.2f} of peak (min: {flops / min(times[p]) / 1e9 / peak:4.2f})"
                if peak
                else ""
            )
            print(
                f"B={batch:4} {p:12} median {med * 1e3:9.2f} ms  x{base / med:5.2f} vs {paths[0]}  keys equal: {same}"
                f"  {flops / med / 1e9:6.1f} GFLOP/s{frac}"
            )
    if args.json:
        doc = dict(
            command="PYTHONPATH=. python bench/cpu_paths.py " + " ".join(sys.argv[1:] if argv is None else argv),
            env=dict(
                env_info("cpu", args.threads),
                fma_peak_isa=peak_isa,
                fma_peak_gflops=statistics.median(peaks) if peaks else None,
                fma_peak_samples_gflops=peaks,
                load_average=list(os.getloadavg()),
            ),
            rows=rows,
        )
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
