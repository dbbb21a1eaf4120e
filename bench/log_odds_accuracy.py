"""|log-odds error| against float64, by log-odds band: the fused op's
(``lm_head_argmax(return_log_odds=True)``) beside the installed vLLM's own
acceptance estimator (0.34 or 0.33) (``OnlineAcceptanceEstimator.predict`` on the full
logits, its Triton kernels interpreted on the CPU: bench/vllm_estimator.py),
both before vLLM's clamp to ±40.

    PYTHONPATH=. python bench/log_odds_accuracy.py [--vocab 32000] [--rows 240] \
        [--out bench/results/log_odds_accuracy.json]

Rows: hidden states whose argmax stands a planted gap (0 .. 60 logits)
above the rest, temperatures 0.5 .. 2; fp32, one rank (the merge across
ranks is tested in tests/test_step_log_odds.py). Prints a markdown table and
writes JSON with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import (bench/vllm_estimator.py)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402

BANDS = ((0, 4), (4, 8), (8, 12), (12, 16), (16, 24), (24, 32), (32, 40))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size V (default 32000)")
    parser.add_argument("--rows", type=int, default=240, help="batch rows measured (default 240)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size H (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON record here")
    args = parser.parse_args(argv)

    import localargmax
    from bench.vllm_estimator import estimator_class

    gen = torch.Generator().manual_seed(args.seed)
    weight = torch.randn(args.vocab, args.hidden, generator=gen) / args.hidden**0.5
    hidden = torch.randn(args.rows, args.hidden, generator=gen)
    gaps = torch.linspace(0, 60, args.rows)
    for b in range(args.rows):  # raise one logit gaps[b] above the rest (a few rounds: the others move too)
        top, w = b % args.vocab, weight[b % args.vocab]
        for _ in range(4):
            logits = hidden[b] @ weight.T
            others = torch.cat([logits[:top], logits[top + 1 :]]).max()
            hidden[b] += (others + gaps[b] - logits[top]) * w / float(w @ w)
    t = 0.5 + 1.5 * torch.rand(args.rows, generator=gen)

    _, ours = localargmax.lm_head_argmax(hidden, weight, return_log_odds=True, temperature=t)
    x = hidden.double() @ weight.double().T / t.double()[:, None]
    top = x.argmax(dim=1, keepdim=True)
    d = (x - x.gather(1, top)).scatter(1, top, -torch.inf)
    f64 = -torch.logsumexp(d, dim=1)

    from vllm import __version__ as vllm_version

    est = estimator_class()(args.rows, 1, torch.device("cpu"))
    est.predict(hidden @ weight.T, torch.arange(args.rows), torch.tensor(0), torch.zeros(args.rows, 1), t)
    vllm = est.features[:, 0]  # clamped to ±40 by vLLM; the bands below stay under 40

    rows = []
    for lo, hi in BANDS:
        m = (f64 >= lo) & (f64 < hi)
        if not bool(m.any()):
            continue
        err = lambda v: float((v.double()[m] - f64[m]).abs().max())  # noqa: E731
        rows.append(
            {"band": [lo, hi], "rows": int(m.sum()), "ours_max_abs_err": err(ours), "vllm_max_abs_err": err(vllm)}
        )
    print(f"| float64 log-odds | rows | ours: max abs error | vLLM {vllm_version}: max abs error |")
    print("|---|---|---|---|")
    for r in rows:
        lo, hi = r["band"]
        print(f"| {lo} to {hi} | {r['rows']} | {r['ours_max_abs_err']:.2g} | {r['vllm_max_abs_err']:.2g} |")
    record = {
        "command": "PYTHONPATH=. python bench/log_odds_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpu": _cpu_model(), "torch": torch.__version__, "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
        "vllm": vllm_version, "vocab": args.vocab, "hidden": args.hidden, "rows_measured": args.rows, "seed": args.seed,
        "bands": rows,
    }  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
