"""Side-by-side timing of the CPU kernel's paths (DESIGN.md, "CPU paths"):
``localargmax.shard_argmax(hidden, weight, path=NAME)`` on one shard for every
path this CPU has, the paths interleaved within each round so that other load
on the machine falls on all of them alike; median over rounds x steps. The
name ``torch`` in --paths times torch's matmul + max over the shard (the
benchmark CLI's torch-matmul-max row) in the same rounds, ``onednn-prepacked``
oneDNN's linear on a weight reordered once (``torch.ops.mkldnn._reorder_linear_weight``,
what a CPU engine packs at load) + max. bf16 rows also report the fraction of the
core's measured vdpbf16ps peak (``_fma_peak("avx512_bf16")``, where the CPU has it; on AMX
CPUs also of oneDNN's own 1024^3 GEMM, which stands for the AMX peak), and
every row its GB/s and fraction of the same rounds' stream read of the weight (an int64 sum). Each row also has
its GFLOP/s (2·B·rows·H per call, at the median) and that as a fraction of
the core's measured FMA peak, also at the fastest call (``_at_min``: on a
shared machine the median includes time the core ran other work): a tight
float32 FMA loop (``localargmax._C._fma_peak``, the widest of zmm / ymm this
CPU has), fastest of 4 short tries once per round; its median over the
rounds is ``env.fma_peak_gflops``, with the load average.

    PYTHONPATH=. python bench/cpu_paths.py --rows 75968 --hidden 4096 --dtype bfloat16 \
        --batch 1,8,64 --threads 2 --json bench/results/cpu_kinds/<file>.json

``--epilogue-share argmax,topk8,sample,lse`` times ``path="brgemm"`` per op
instead: each call with the epilogue (emit_block) and with the tiles alone
(``localargmax._C._brgemm_epilogue(False)``: the same oneDNN calls, no keys),
interleaved; the epilogue's share is 1 - tiles / with, at the medians (and at
the fastest calls). ``--shape draft`` / ``qwen3`` / ``minilm`` name the
issue's shards (75968 x 1024, 75968 x 4096, 15261 x 384) for --rows / --hidden.
``--brgemm-blocks 64x64x1,64x64x4`` times ``path="brgemm"`` argmax under the rule's
block and each block named (M weight rows x N batch rows, in STEP calls of every
STEP-th row; forced with ``localargmax._C._brgemm_block``), interleaved, with
each block's speed against the rule's and whether its keys equal the rule's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

import localargmax
from localargmax.bench.report import cpu_paths_available, env_info

SHAPES = {"draft": (75968, 1024), "qwen3": (75968, 4096), "minilm": (15261, 384)}


IDS_ONLY = {"torch", "onednn-prepacked"}
"""Rows that give ids, not keys (compared by id)."""


def op_call(op: str, hidden: torch.Tensor, weight: torch.Tensor, path: str):
    """One call of the named op (argmax, topk<k>, sample, lse) on path."""
    if op == "argmax":
        return localargmax.shard_argmax(hidden, weight, path=path)
    if op.startswith("topk"):
        return localargmax.shard_topk(hidden, weight, int(op[4:]), path=path)
    if op == "sample":
        t = torch.full((hidden.shape[0],), 0.8)
        return localargmax.shard_sample(hidden, weight, t, 1234, path=path)
    if op == "lse":
        return localargmax.shard_argmax(hidden, weight, path=path, log_partition=True)
    raise SystemExit(f"--epilogue-share: unknown op {op!r} (argmax, topk<k>, sample, lse)")


def interleaved(call, settings, apply, args) -> dict:
    """Times of call() under each setting (apply(setting) before its calls): a warm-up call each, then
    args.rounds rounds of args.steps calls per setting, the settings interleaved within each round."""
    times: dict = {s: [] for s in settings}
    for s in settings:
        apply(s)
        call()
    for _ in range(args.rounds):
        for s in settings:
            apply(s)
            for _ in range(args.steps):
                t0 = time.perf_counter()
                call()
                times[s].append(time.perf_counter() - t0)
    return times


def write_brgemm_record(args, kind: str, rows: list) -> None:
    """The JSON record of a path=brgemm mode (--brgemm-blocks, --epilogue-share) at args.json, if given."""
    if not args.json:
        return
    doc = dict(
        kind=kind,
        command="PYTHONPATH=. python bench/cpu_paths.py " + " ".join(sys.argv[1:]),
        env=dict(
            env_info("cpu", args.threads),
            brgemm_mode=localargmax._C._brgemm_mode(args.dtype),
            load_average=list(os.getloadavg()),
        ),
        rows=rows,
    )
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


def parse_block(text: str) -> tuple[int, ...]:
    """'64x64x4' -> (64, 64, 4); 'MxN' -> (M, N, 1)."""
    try:
        block = tuple(int(v) for v in text.split("x"))
    except ValueError:
        block = ()
    if len(block) not in (2, 3):
        raise SystemExit(f"--brgemm-blocks: {text!r} is not MxN or MxNxSTEP (e.g. 64x64x4)")
    return block if len(block) == 3 else (*block, 1)


def brgemm_blocks(args) -> int:
    """path=brgemm argmax per batch under the rule's block and each forced block, interleaved."""
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(args.rows, args.hidden, generator=gen) / args.hidden**0.5).to(dtype)
    amx = localargmax._C._brgemm_mode(args.dtype) == "amx"
    forced = [parse_block(b) for b in args.brgemm_blocks.split(",")]
    if len(set(forced)) < len(forced) or (0, 0, 1) in forced:
        raise SystemExit(f"--brgemm-blocks: each block once, none 0x0 (the rule, always timed): {args.brgemm_blocks}")
    settings = [(0, 0, 1), *forced]  # (0, 0, 1): the rule

    def apply(block):
        try:
            localargmax._C._brgemm_block(1, args.hidden, amx, block)
        except ValueError as e:
            raise SystemExit(f"--brgemm-blocks: {e}") from None

    rows = []
    try:
        for batch in (int(b) for b in args.batch.split(",")):
            hidden = torch.randn(batch, args.hidden, generator=gen).to(dtype)
            keys = {}
            for block in settings:
                apply(block)
                keys[block] = localargmax.shard_argmax(hidden, weight, path="brgemm")
            times = interleaved(lambda: localargmax.shard_argmax(hidden, weight, path="brgemm"), settings, apply, args)
            rule = localargmax._C._brgemm_block(batch, args.hidden, amx, (0, 0))
            base = statistics.median(times[(0, 0, 1)])
            for block in settings:
                median = statistics.median(times[block])
                name = "rule {}x{}x{}".format(*rule) if block == (0, 0, 1) else "{}x{}x{}".format(*block)
                rows.append(
                    dict(
                        block=name,
                        batch=batch,
                        dtype=args.dtype,
                        rows=args.rows,
                        hidden=args.hidden,
                        median_us=median * 1e6,
                        min_us=min(times[block]) * 1e6,
                        speedup_vs_rule=base / median,
                        keys_equal_rule=bool(torch.equal(keys[block], keys[(0, 0, 1)])),
                        samples=len(times[block]),
                    )
                )
                print(
                    f"B={batch:4} {name:16} median {median * 1e3:9.2f} ms  min {min(times[block]) * 1e3:9.2f} ms  "
                    f"x {base / median:4.2f} vs the rule  keys equal: {rows[-1]['keys_equal_rule']}"
                )
    finally:
        localargmax._C._brgemm_block(1, args.hidden, amx, (0, 0))
    write_brgemm_record(args, "brgemm_blocks", rows)
    return 0


def epilogue_share(args) -> int:
    """path=brgemm per op and batch: median time with the epilogue and with the tiles alone, interleaved."""
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(args.rows, args.hidden, generator=gen) / args.hidden**0.5).to(dtype)
    ops = args.epilogue_share.split(",")
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        hidden = torch.randn(batch, args.hidden, generator=gen).to(dtype)
        for op in ops:
            times = interleaved(
                lambda: op_call(op, hidden, weight, "brgemm"), (True, False), localargmax._C._brgemm_epilogue, args
            )
            localargmax._C._brgemm_epilogue(True)
            with_, tiles = statistics.median(times[True]), statistics.median(times[False])
            share, share_min = 1 - tiles / with_, 1 - min(times[False]) / min(times[True])
            rows.append(
                dict(
                    op=op,
                    path="brgemm",
                    batch=batch,
                    dtype=args.dtype,
                    rows=args.rows,
                    hidden=args.hidden,
                    with_epilogue_us=with_ * 1e6,
                    tiles_only_us=tiles * 1e6,
                    epilogue_share=share,
                    epilogue_share_at_min=share_min,
                    samples=len(times[True]),
                )
            )
            print(
                f"B={batch:4} {op:8} with epilogue {with_ * 1e3:9.2f} ms  tiles alone {tiles * 1e3:9.2f} ms  "
                f"epilogue share {share:6.1%} (at the fastest calls: {share_min:6.1%})"
            )
    write_brgemm_record(args, "epilogue_share", rows)
    return 0


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
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a named shard: sets --rows and --hidden")
    ap.add_argument(
        "--epilogue-share",
        default=None,
        help="comma-separated ops (argmax, topk<k>, sample, lse): time path=brgemm with and without its epilogue",
    )
    ap.add_argument(
        "--brgemm-blocks",
        default=None,
        help="comma-separated brgemm blocks MxN or MxNxSTEP (M, N 16 / 32 / 64; STEP 1 / 2 / 4, M / STEP >= 16): "
        "time path=brgemm argmax under the rule's block and each of these, interleaved",
    )
    args = ap.parse_args(argv)
    if args.shape:
        args.rows, args.hidden = SHAPES[args.shape]
    if args.epilogue_share:
        return epilogue_share(args)
    if args.brgemm_blocks:
        return brgemm_blocks(args)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    paths = args.paths.split(",") if args.paths else cpu_paths_available()
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(args.rows, args.hidden, generator=gen) / args.hidden**0.5).to(dtype)
    peak_isa = "avx512" if "avx512" in cpu_paths_available() else "avx2" if "avx2" in cpu_paths_available() else None
    dp_isa = "avx512_bf16" if args.dtype == "bfloat16" and "avx512_bf16" in cpu_paths_available() else None
    # AMX (bf16 / fp16 where brgemm runs on the tiles): no hand-written probe (DESIGN.md, "No hand-written AMX
    # path"); oneDNN's own GEMM of 1024 x 1024 x 1024 stands for the peak: what oneDNN reaches on the tiles
    amx = args.dtype != "float32" and localargmax._C._brgemm_mode(args.dtype) == "amx"
    amx_square = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1)).to(dtype) if amx else None
    peaks: list[float] = []
    dp_peaks: list[float] = []
    amx_peaks: list[float] = []
    streams: list[float] = []
    words = weight.view(torch.int64) if weight.numel() * weight.element_size() % 8 == 0 else None

    def measure_peak():
        if peak_isa is not None:  # ~10 ms, 4 tries, the fastest
            peaks.append(max(localargmax._C._fma_peak(peak_isa, 100_000) for _ in range(4)) / 1e9)
        if dp_isa is not None:
            dp_peaks.append(max(localargmax._C._fma_peak(dp_isa, 100_000) for _ in range(4)) / 1e9)
        if amx_square is not None:  # fastest of 4
            best = math.inf
            for _ in range(4):
                t0 = time.perf_counter()
                torch.matmul(amx_square, amx_square)
                best = min(best, time.perf_counter() - t0)
            amx_peaks.append(2 * 1024**3 / best / 1e9)
        if words is not None:  # the weight's stream read: an int64 sum, fastest of 3
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                words.sum()
                best = min(best, time.perf_counter() - t0)
            streams.append(weight.numel() * weight.element_size() / best / 1e9)

    packed = {}
    if "onednn-prepacked" in (args.paths or ""):  # oneDNN's weight reordered once per batch size, as vLLM's CPU linear
        try:
            packed = {int(b): torch.ops.mkldnn._reorder_linear_weight(weight, int(b)) for b in args.batch.split(",")}
        except RuntimeError as e:  # e.g. bf16 on an AVX2-only CPU: oneDNN has no bf16 linear there
            raise SystemExit(
                f"--paths onednn-prepacked: oneDNN cannot prepack a {args.dtype} linear weight on this CPU "
                f"({str(e).splitlines()[0]}); leave it out of --paths"
            ) from None

    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        hidden = torch.randn(batch, args.hidden, generator=gen).to(dtype)

        def call(p):
            if p == "torch":  # ids (not keys): compared by id below
                return torch.matmul(hidden, weight.T).max(dim=1).indices
            if p == "onednn-prepacked":
                logits = torch.ops.mkldnn._linear_pointwise(hidden, packed[batch], None, "none", [], "")
                return logits.max(dim=1).indices
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
        dp_peak = statistics.median(dp_peaks) if dp_peaks else None
        amx_peak = statistics.median(amx_peaks) if amx_peaks else None
        stream = statistics.median(streams) if streams else None
        nbytes = weight.numel() * weight.element_size()
        flops = 2.0 * batch * args.rows * args.hidden
        base = statistics.median(times[paths[0]])
        for p in paths:
            med = statistics.median(times[p])
            if {p, paths[0]} & IDS_ONLY:  # torch gives ids: compare the ids
                a, b = (keys[q] if q in IDS_ONLY else localargmax.decode_keys(keys[q])[0] for q in (p, paths[0]))
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
                    fraction_of_dp_peak=flops / med / 1e9 / dp_peak if dp_peak else None,
                    fraction_of_amx_gemm=flops / med / 1e9 / amx_peak if amx_peak else None,
                    gbps=nbytes / med / 1e9,
                    fraction_of_stream=nbytes / med / 1e9 / stream if stream else None,
                )
            )
            frac = (
                f"  {flops / med / 1e9 / peak:4.2f} of peak (min: {flops / min(times[p]) / 1e9 / peak:4.2f})"
                if peak
                else ""
            )
            if dp_peak:
                frac += f"  {flops / med / 1e9 / dp_peak:4.2f} of the dp peak"
            if amx_peak:
                frac += f"  {flops / med / 1e9 / amx_peak:4.2f} of the AMX GEMM"
            if stream:
                frac += f"  {nbytes / med / 1e9:5.1f} GB/s = {nbytes / med / 1e9 / stream:4.2f} of stream"
            print(
                f"B={batch:4} {p:16} median {med * 1e3:9.2f} ms  x{base / med:5.2f} vs {paths[0]}  keys equal: {same}"
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
                dp_peak_isa=dp_isa,
                dp_peak_gflops=statistics.median(dp_peaks) if dp_peaks else None,
                amx_gemm_gflops=statistics.median(amx_peaks) if amx_peaks else None,
                amx_gemm="oneDNN's GEMM 1024^3 in this dtype on these threads, fastest of 4 a round (for AMX's peak)"
                if amx_peaks
                else None,
                stream_gbps=statistics.median(streams) if streams else None,
                load_average=list(os.getloadavg()),
            ),
            rows=rows,
        )
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
