"""``python -m bench.emu_bytes`` (from the repository root): how many times each
CUDA route ``auto`` takes reads the weight shard, per op and batch, counted by
the host emulation of the kernels (tests/support/emulation.py: every global
load, cp.async and TMA source; no GPU needed, and no timing: the emulation
cannot time).

For a shard shape (default: qwen3's lm_head at TP 8, 18992 x 4096 bf16) and
each batch, the route is C++ ``auto``'s (``localargmax._C._choose_cuda_path``;
float32 takes ``simt``, top-k ``mma``), the tensor-core config ``launch_mma``'s own
choice for an H200 (132 SMs, 227 KiB of shared memory a block). The count runs
that same path and config on a shard of the same kind cut to ``--rows`` x
``--hidden`` (a pass reads every weight byte once whatever the shape:
tests/test_emulation_bytes.py), so ``weight_passes`` is the bytes requested
over the shard's bytes. ``gemm`` (cuBLAS, then the keys from the logits) is
not emulated: it reads the weight once and writes ``B x rows`` float32 logits,
reported as ``logits_written_bytes`` at the real shape. Issue #69's target:
one pass and no logits at every batch up to 256.

    python -m bench.emu_bytes --json bench/results/emu_weight_passes.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

import torch

from localargmax._ext import _C
from localargmax.bench.report import cpu_name, write_output
from tests.support.emulation import DEFAULT_SM_COUNT, DEFAULT_SMEM_LIMIT, Emulator, build

OPS = ("argmax", "topk8", "sample", "lse")
"""The ops counted: the emulator's ``weight_passes`` names, top-k at k 8."""
BATCHES = (1, 2, 4, 8, 16, 17, 32, 64, 128, 256)


def route(emu: Emulator, op: str, batch: int, rows: int, hidden: int, half: bool) -> str:
    """``auto``'s path and config for one call: "simt", "gemm" or "mma/<config>"."""
    topk = op.startswith("topk")
    path = _C._choose_cuda_path(half, topk, True, batch, rows)
    if path != "mma":
        return path
    return "mma/" + emu.mma_config(hidden, rows, batch, DEFAULT_SM_COUNT, DEFAULT_SMEM_LIMIT, topk)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.emu_bytes", description=__doc__.split("\n\n")[0])
    p.add_argument("--shard", default="18992x4096", help="the real shard, ROWSxHIDDEN (default: qwen3 at TP 8)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--batch", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--rows", type=int, default=200, help="rows of the emulated shard (the count is per pass)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size of the emulated shard")
    p.add_argument("--json", help="write the rows and the command here")
    args = p.parse_args(argv)
    rows, hidden = (int(x) for x in args.shard.lower().split("x"))
    dtype = getattr(torch, args.dtype)
    half = dtype != torch.float32
    batches = [int(b) for b in args.batch.split(",")]
    ops = args.ops.split(",")
    if bad := [o for o in ops if o not in OPS]:
        p.error(f"--ops: unknown {bad}; choose from {', '.join(OPS)}")
    emu = Emulator(build())
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(args.rows, args.hidden, generator=gen).to(dtype)
    out = []
    print(f"{'op':7} {'B':>4}  {'auto route':22} {'weight passes':>13}  logits written")
    for op in ops:
        for batch in batches:
            path = route(emu, op, batch, rows, hidden, half)
            lse = op == "lse"
            if path.startswith("mma/") and lse and path.endswith("_tma"):
                path = path.removesuffix("_tma")  # run_mma takes the cp.async twin for the log-partition
            if path == "gemm":
                passes, logits = 1.0, batch * rows * 4
            else:
                hidden_states = torch.randn(batch, args.hidden, generator=gen).to(dtype)
                passes, logits = emu.weight_passes(op.removesuffix("8"), hidden_states, weight, path, k=8), 0
            out.append({"op": op, "batch": batch, "route": path, "weight_passes": passes,
                        "logits_written_bytes": logits, "emulated": path != "gemm"})  # fmt: skip
            written = f"{logits / 2**20:.1f} MiB" if logits else "-"
            print(f"{op:7} {batch:>4}  {path:22} {passes:>13.2f}  {written}", flush=True)
    one_pass = sum(r["weight_passes"] == 1 and not r["logits_written_bytes"] for r in out)
    print(f"one pass, no logits: {one_pass} of {len(out)} (op, batch) cells; the emulation cannot time")
    if args.json:
        given = sys.argv[1:] if argv is None else argv
        doc = {
            "kind": "emu_weight_passes",
            "command": " ".join(["python -m bench.emu_bytes", *map(shlex.quote, given)]),
            "cpu": cpu_name(),
            "shard": {"rows": rows, "hidden": hidden, "dtype": args.dtype},
            "emulated_shard": {"rows": args.rows, "hidden": args.hidden},
            "device_model": {"sm_count": DEFAULT_SM_COUNT, "smem_limit": DEFAULT_SMEM_LIMIT},
            "rows": out,
        }
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
