"""``--kernel-only``: the local step alone, on one process, no ranks.

Rows per shard:

* ``fused-kernel``: ``localargmax.shard_argmax`` (logits never written), on the
  path it picks by itself (``cuda_path`` "auto");
* on CUDA with bf16 / fp16, the same op forced onto each of its paths
  (the op's ``path`` argument): ``fused-simt`` (CUDA-core kernel), ``fused-mma``
  (tensor-core kernel), ``gemm-keys`` (cuBLAS float32 logits + keys kernel),
  so one run shows where each path wins;
* ``lm-head-step``: the whole step ``localargmax.lm_head_argmax`` (kernel,
  exchange, merge) in a world-size-1 process group (NCCL on CUDA, gloo on
  CPU; world size 1 skips the collective itself);
* ``torch-matmul-max``: ``(hidden @ weight.T).max(dim=1)``, the unfused path;
* ``stream-read``: the bandwidth bound of the same run, on the same weight
  buffers. On CPU it is the faster of two torch reads of the weight's bytes:
  ``w.view(int64).sum()`` (runs on all of torch's threads: 31 GB/s on this
  project's 2-core machine) and ``torch.mv`` of the bytes viewed as float32
  with a ones vector (one thread in torch 2.14: 19 GB/s; the only bound used
  before 2026-11-29, which flattered every CPU ratio); ``stream_method``
  names the winner. On CUDA it is a device-to-device copy ``dst.copy_(w)``,
  whose GB/s counts the bytes read *and* written (``weight_bytes`` = 2 x the
  weight's bytes in that row), the usual "copy bandwidth" a read-only kernel
  is compared against. Both are measured before and after the kernel rows
  and the faster is kept (other work on a shared machine
  otherwise makes a single measurement a poor bound).

``gbps`` = weight bytes / median time; ``fraction_of_stream`` = gbps / the
stream-read gbps of the same run. The weight is rotated through ``buffers``
copies (2 when they fit, see :func:`buffer_count`) so no call finds it in a
cache left warm by the previous one; on CPU an engine-sized shard is far larger
than the last-level cache anyway. CUDA times with CUDA events, CPU with
``time.perf_counter``.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, List

import numpy as np
import torch
import torch.distributed as dist

from .. import decode_keys, lm_head_argmax, shard_argmax
from .data import Shape, reference_ids
from .report import add_speedups
from .runner import DTYPES, RunConfig, free_port


def buffer_count(nbytes: int, device: torch.device) -> int:
    """2 weight copies when two fit in 40% of the free memory, else 1."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _mem_available()
    return 2 if 2 * nbytes <= 0.4 * free else 1


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def as_float32_matrix(weight: torch.Tensor) -> torch.Tensor:
    """The weight's bytes reinterpreted as a float32 matrix (no copy)."""
    flat = weight.reshape(-1).view(torch.uint8)
    n32 = flat.numel() // 4
    cols = weight.shape[1] * weight.element_size() // 4 if weight.shape[1] * weight.element_size() % 4 == 0 else 1024
    n32 -= n32 % cols
    return flat[: 4 * n32].view(torch.float32).view(-1, cols)


# Rows that force one CUDA path of shard_argmax (its `path` argument, see
# csrc/cuda/shard_argmax_cuda.cu): bf16 / fp16 on CUDA only.
CUDA_PATH_METHODS = {"simt": "fused-simt", "mma": "fused-mma", "gemm": "gemm-keys"}


def as_int64_flat(weight: torch.Tensor) -> torch.Tensor:
    """The weight's bytes reinterpreted as a flat int64 vector (no copy; a
    tail of fewer than 8 bytes is left out)."""
    flat = weight.reshape(-1).view(torch.uint8)
    n64 = flat.numel() // 8
    return flat[: 8 * n64].view(torch.int64)


def time_calls(fn: Callable, buffers: List[torch.Tensor], steps: int, warmup: int, budget_s: float, cuda: bool):
    """Call ``fn(buffer)`` rotating over ``buffers``; return (times in seconds, last output).

    After ``warmup`` calls, the number of timed calls is cut to fit ``budget_s``
    (at least 3) when ``budget_s > 0``.
    """
    out = None
    start_w = time.perf_counter()
    for i in range(warmup):
        out = fn(buffers[i % len(buffers)])
    if cuda:
        torch.cuda.synchronize()
    per_call = (time.perf_counter() - start_w) / max(warmup, 1)
    if budget_s > 0 and warmup > 0:
        steps = max(3, min(steps, int(budget_s / max(per_call, 1e-9))))
    times = []
    for i in range(steps):
        buf = buffers[(warmup + i) % len(buffers)]
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = fn(buf)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            out = fn(buf)
            times.append(time.perf_counter() - begin)
    return times, out


def run_kernel_only(cfg: RunConfig, shape: Shape, rows: int, budget_s: float) -> List[dict]:
    """Time the local step on a ``[rows, H]`` shard (lm_head rows ``[0, rows)``)
    and return the result rows (see the module docstring)."""
    torch.set_num_threads(cfg.threads)
    cuda = cfg.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = DTYPES[cfg.dtype]
    weight = torch.empty(rows, shape.hidden, dtype=dtype, device=device)
    for row0, block in shape.blocks(0, rows):
        weight[row0 : row0 + block.shape[0]].copy_(block.to(dtype))
    nbytes = weight.numel() * weight.element_size()
    buffers = [weight] + [weight.clone() for _ in range(buffer_count(nbytes, device) - 1)]
    hidden_all = shape.hidden_states(max(cfg.batches))
    print(f"kernel-only {shape.name}: shard [{rows}, {shape.hidden}] {cfg.dtype} = {nbytes / 1e9:.2f} GB, "
          f"{len(buffers)} rotating buffer(s); float64 reference ...", file=sys.stderr)
    reference = reference_ids(shape, hidden_all, dtype, 0, rows)

    common = dict(model=shape.model, shape=shape.name, tp=1, vocab=shape.vocab, hidden=shape.hidden,
                  draft_vocab=None, rows=rows, dtype=cfg.dtype, device=cfg.device, buffers=len(buffers))
    if cuda:
        copy_dst = torch.empty_like(weight)
        stream_fns = {"d2d-copy": lambda w: copy_dst.copy_(w)}
        stream_bytes = 2 * nbytes
    else:
        ones = torch.ones(as_float32_matrix(weight).shape[1], dtype=torch.float32, device=device)
        stream_fns = {"int64-sum": lambda w: as_int64_flat(w).sum(),
                      "float32-mv": lambda w: torch.mv(as_float32_matrix(w), ones)}
        stream_bytes = nbytes

    def stream_read():
        best = None
        for name, fn in stream_fns.items():
            times, _ = time_calls(fn, buffers, cfg.steps, cfg.warmup, budget_s, cuda)
            row = _row("stream-read", None, times, stream_bytes, common)
            row["stream_method"] = name
            if best is None or row["median_us"] < best["median_us"]:
                best = row
        return best

    first_stream = stream_read()
    group, own_group = _world_size_1_group(cuda)
    kernel_rows = []
    for batch in cfg.batches:
        hidden = hidden_all[:batch].to(dtype).to(device)
        fused = lambda w: shard_argmax(hidden, w)  # noqa: E731
        methods = [("torch-matmul-max", lambda w: (hidden @ w.T).max(dim=1).indices, None),
                   ("fused-kernel", fused, None),
                   ("lm-head-step", lambda w: lm_head_argmax(hidden, w, group=group), None)]
        if cuda and dtype in (torch.bfloat16, torch.float16):
            methods += [(name, lambda w, p=path: shard_argmax(hidden, w, path=p), path)
                        for path, name in CUDA_PATH_METHODS.items()]
        for method, fn, path in methods:
            print(f"  {method} B={batch} ...", file=sys.stderr)
            times, out = time_calls(fn, buffers, cfg.steps, cfg.warmup, budget_s, cuda)
            ids = out if method in ("torch-matmul-max", "lm-head-step") else decode_keys(out)[0]
            row = _row(method, batch, times, nbytes, common)
            row["cuda_path"] = path if path is not None else ("auto" if cuda else None)
            row["agree"] = (ids.cpu() == reference[:batch]).double().mean().item()
            kernel_rows.append(row)
    if own_group:
        dist.destroy_process_group()
    stream = min(first_stream, stream_read(), key=lambda r: r["median_us"])
    stream["fraction_of_stream"] = 1.0
    for row in kernel_rows:
        row["fraction_of_stream"] = row["gbps"] / stream["gbps"]
    out_rows = [stream] + kernel_rows
    add_speedups(out_rows, "torch-matmul-max", "speedup_vs_torch")
    return out_rows


def _world_size_1_group(cuda: bool):
    """(group, created): a world-size-1 process group (NCCL on CUDA, gloo on
    CPU) for the ``lm-head-step`` rows; the existing one when this process
    already runs in a single-rank group. A multi-rank group is not used: the
    kernel-only rows are one process's local step."""
    if dist.is_initialized():
        if dist.get_world_size() == 1:
            return dist.group.WORLD, False
        raise RuntimeError("--kernel-only runs in one process; it was started in a multi-rank process group")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    return dist.group.WORLD, True


def _row(method, batch, times, nbytes, common) -> dict:
    times_us = np.array(times) * 1e6
    median = float(np.median(times_us))
    return dict(method=method, batch=batch, **common, steps=len(times), median_us=median,
                p90_us=float(np.percentile(times_us, 90)), weight_bytes=nbytes, gbps=nbytes / (median * 1e-6) / 1e9,
                fraction_of_stream=None, speedup_vs_torch=None, agree=None)
