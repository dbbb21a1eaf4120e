"""``--kernel-only``: the local step alone, on one process, no ranks, for
``--op argmax|topk|sample``, on the rank-0 shard of each ``--tp`` (or a
``--rows`` shard), beside FlashSampling's baselines and the roofline.

Rows per shard and batch (``method``):

* ours: ``fused-kernel`` (``shard_argmax`` / ``shard_topk`` / ``shard_sample``,
  logits never written, on the path it picks itself: ``cuda_path`` "auto");
  ``lm-head-step`` (the whole ``lm_head_*`` step in a world-size-1 process
  group, NCCL on CUDA, gloo on CPU; world size 1 skips the collective itself);
  on CUDA with bf16 / fp16 the fused op forced onto each of its paths (the
  op's ``path`` argument): ``fused-simt`` (batch <= 8 only), ``fused-mma``,
  ``gemm-keys`` (cuBLAS float32 logits + keys kernel; argmax and sample only);
* baselines (``localargmax.bench.rival``): argmax ``torch-matmul-max``; topk
  ``torch-matmul-topk``; sample ``gumbel-logits`` (matmul -> logits ->
  Gumbel-max, compiled), ``compiled-multinomial`` (matmul + softmax +
  multinomial, compiled), ``flashinfer`` (FI2; a row with ``skip_reason``
  when it cannot run).

Yardsticks (``batch`` null): ``gemm-peak`` (the run's large square GEMM in
the dtype: ``tflops``), and per shard ``stream-read`` (a read-only pass over
the same weight bytes: the fastest of ``w.view(int64).sum()`` and, on CUDA,
``w.sum(dtype=float32)`` at the weight's dtype, on CPU a float32 ``mv`` with a
ones vector; ``stream_method`` names it) and
``d2d-copy`` (``dst.copy_(w)``, ``weight_bytes`` counts read + write). Both
are measured before and after the kernel rows and the faster is kept (other
work on a shared machine otherwise makes one measurement a poor bound).

Derived columns (:func:`annotate`): ``gbps`` = weight bytes / median;
``fraction_of_stream`` / ``fraction_of_copy`` = gbps / the yardstick's gbps;
``roofline_us`` = max(weight bytes / stream-read bandwidth, 2·B·rows·H / GEMM
rate), ``fraction_of_roofline`` = roofline_us / median; ``speedup_vs_*`` =
baseline median / this median; ``flashsampling_h200`` = FlashSampling's
published H200 ratios for the cells that have one, with their source.

The weight is rotated through ``buffers`` copies (2 when they fit, see
:func:`buffer_count`) so no call finds it in a cache left warm by the previous
one. CUDA times by CUDA-graph replay (rows say ``timing``: see
:mod:`localargmax.bench.timing`), CPU with ``time.perf_counter``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from .. import decode_keys, lm_head_argmax, shard_argmax
from .data import Shape, free_memory, reference_ids
from .report import cpu_features
from .runner import DTYPES, SAMPLE_OFFSET, RunConfig, cpu_path_of, free_port
from .timing import time_cuda


def buffer_count(nbytes: int, device: torch.device) -> int:
    """2 weight copies when two fit in 40% of the free memory, else 1."""
    return 2 if 2 * nbytes <= 0.4 * free_memory(device) else 1


def as_float32_matrix(weight: torch.Tensor) -> torch.Tensor:
    """The weight's bytes reinterpreted as a float32 matrix (no copy)."""
    flat = weight.reshape(-1).view(torch.uint8)
    n32 = flat.numel() // 4
    cols = weight.shape[1] * weight.element_size() // 4 if weight.shape[1] * weight.element_size() % 4 == 0 else 1024
    n32 -= n32 % cols
    return flat[: 4 * n32].view(torch.float32).view(-1, cols)


# Rows that force one CUDA path of shard_argmax (its `path` argument, see
# csrc/cuda/shard_ops_cuda.cu): bf16 / fp16 on CUDA only.
CUDA_PATH_METHODS = {"simt": "fused-simt", "mma": "fused-mma", "gemm": "gemm-keys"}
SIMT_MAX_BATCH = 8  # forced simt rows only up to here: issue-bound past it (ms per call), they tell nothing


def as_int64_flat(weight: torch.Tensor) -> torch.Tensor:
    """The weight's bytes reinterpreted as a flat int64 vector (no copy; a
    tail of fewer than 8 bytes is left out)."""
    flat = weight.reshape(-1).view(torch.uint8)
    n64 = flat.numel() // 8
    return flat[: 8 * n64].view(torch.int64)


def time_calls(fn: Callable, buffers: list[torch.Tensor], steps: int, warmup: int, budget_s: float, cuda: bool):
    """Call ``fn(buffer)`` rotating over ``buffers``; return (times in seconds, last output).

    After ``warmup`` calls, the number of timed calls is cut to fit ``budget_s``
    (at least 3) when ``budget_s > 0``. CUDA: CUDA-graph replay of many calls
    (:func:`localargmax.bench.timing.time_cuda`; the times say how: ``timing``).
    """
    if cuda:
        return time_cuda(fn, buffers, steps, warmup, budget_s)
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


def run_kernel_only(
    cfg: RunConfig, shape: Shape, shards, budget_s: float, compile_baselines: bool = True
) -> list[dict]:
    """Time ``cfg.op``'s local step on each ``(tp, rows)`` shard of ``shards``
    (lm_head rows ``[0, rows)``, the rank-0 shard of that tp; tp None for a
    ``--rows`` shard) with the op's baselines and the yardsticks, and return
    the result rows (see the module docstring and :func:`annotate`)."""
    torch.set_num_threads(cfg.threads)
    cuda = cfg.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = DTYPES[cfg.dtype]
    common = dict(
        model=shape.model,
        shape=shape.name,
        vocab=shape.vocab,
        hidden=shape.hidden,
        draft_vocab=None,
        dtype=cfg.dtype,
        device=cfg.device,
        op=cfg.op,
    )
    if cfg.op == "topk":
        common["k"] = cfg.k
    if cfg.op == "sample":
        common.update(temperature=cfg.temperature, seed=cfg.seed, offset=SAMPLE_OFFSET, noise=cfg.noise)
    if cfg.log_probs:
        common["log_probs"] = True
    first_gemm = _gemm_peak(cfg, device, dtype, budget_s, common)
    samplers = _samplers(cfg, compile_baselines, cuda)
    group, own_group = _world_size_1_group(cuda)
    out = []
    try:
        for tp, rows in shards:
            out += _shard_rows(cfg, shape, tp, rows, budget_s, samplers, device, dtype, group, common)
    finally:
        if own_group:
            dist.destroy_process_group()
    # Measured before and after the kernel rows, the faster kept (as the stream yardsticks).
    out.insert(0, max(first_gemm, _gemm_peak(cfg, device, dtype, budget_s, common), key=lambda r: r["tflops"]))
    annotate(out, cfg.op)
    return out


def _gemm_peak(cfg, device, dtype, budget_s, common) -> dict:
    """The ``gemm-peak`` yardstick: a square ``n x n x n`` torch GEMM
    (:func:`rival.gemm_shape`), ``tflops`` = 2·n³ / median. On CUDA in the run
    dtype (the tensor-core rate); on CPU the faster of the run dtype and
    float32 (any kernel can widen to float32 and use the FMA units), the run
    dtype only where the CPU has its arithmetic (:func:`_cpu_has_units`):
    elsewhere torch's bf16 / fp16 GEMM widens to float32 far slower than its
    float32 GEMM (1.3 s a call at n 1024 on the AVX2-only EPYC) and cannot
    win. ``gemm_dtype`` names the winner."""
    from .rival import gemm_shape

    n = gemm_shape(device)
    cuda = device.type == "cuda"
    best = None
    if cuda or dtype == torch.float32:
        gemm_dtypes = [dtype]
    else:
        gemm_dtypes = ([dtype] if _cpu_has_units(dtype) else []) + [torch.float32]
    for gemm_dtype in gemm_dtypes:
        a, b = (torch.randn(n, n, device=device).to(gemm_dtype) for _ in range(2))
        print(f"kernel-only: {n}x{n}x{n} {gemm_dtype} GEMM rate ...", file=sys.stderr)
        times, _ = time_calls(lambda m: m @ b, [a], cfg.steps, cfg.warmup, budget_s, cuda)  # noqa: B023
        row = _row("gemm-peak", None, times, 3 * n * n * a.element_size(), dict(common, tp=None, rows=None, buffers=1))
        name = str(gemm_dtype).replace("torch.", "")
        row.update(
            gbps=None,
            gemm_n=n,
            gemm_dtype=name,
            note=f"{n}^3 {name} GEMM",
            flops=2.0 * n**3,
            tflops=2.0 * n**3 / (row["median_us"] * 1e-6) / 1e12,
        )
        if best is None or row["tflops"] > best["tflops"]:
            best = row
    return best


def _cpu_has_units(dtype: torch.dtype, flags: str | None = None) -> bool:
    """Whether this CPU (or one with /proc/cpuinfo ``flags``) has arithmetic
    for ``dtype`` (bf16: avx512_bf16 or amx_bf16; fp16: avx512_fp16); True
    where the flags cannot be read."""
    have = cpu_features(flags)
    if None in have.values():
        return True
    if dtype == torch.bfloat16:
        return have["avx512_bf16"] or have["amx_bf16"]
    return have["avx512_fp16"]


def _samplers(cfg, compile_baselines: bool, cuda: bool):
    """``(gumbel, multinomial, (flashinfer fn, skip reason))`` for --op sample,
    built once per run (compiled with dynamic shapes: one compilation serves
    every shard and batch); None for the other ops."""
    from .rival import flashinfer_sampler, gumbel_logits_sample, maybe_compile, multinomial_sample

    if cfg.op != "sample":
        return None
    flashinfer = flashinfer_sampler() if cuda else (None, "flashinfer runs on CUDA only (this run: CPU)")
    return (
        maybe_compile(gumbel_logits_sample, compile_baselines),
        maybe_compile(multinomial_sample, compile_baselines),
        flashinfer,
    )


def _shard_rows(cfg, shape, tp, rows, budget_s, samplers, device, dtype, group, common) -> list[dict]:
    """Rows of one shard: stream-read and d2d-copy yardsticks, then per batch
    the op's baselines and our rows."""
    from .. import lm_head_sample, lm_head_topk, shard_sample, shard_topk, vllm_noise
    from .data import reference_topk
    from .rival import OUR_METHODS, vllm_gumbel_logits_sample

    cuda = device.type == "cuda"
    weight = torch.empty(rows, shape.hidden, dtype=dtype, device=device)
    for row0, block in shape.blocks(0, rows):
        weight[row0 : row0 + block.shape[0]].copy_(block.to(dtype))
    nbytes = weight.numel() * weight.element_size()
    buffers = [weight] + [weight.clone() for _ in range(buffer_count(nbytes, device) - 1)]
    hidden_all = shape.hidden_states(max(cfg.batches))
    common = dict(common, tp=tp, rows=rows, buffers=len(buffers))
    print(
        f"kernel-only {shape.name} tp={tp}: shard [{rows}, {shape.hidden}] {cfg.dtype} = {nbytes / 1e9:.2f} GB, "
        f"{len(buffers)} rotating buffer(s); float64 reference ...",
        file=sys.stderr,
    )
    reference = None
    if cfg.op == "argmax":
        reference = reference_ids(shape, hidden_all, dtype, 0, rows)
    elif cfg.op == "topk":
        reference = reference_topk(shape, hidden_all, dtype, cfg.k, 0, rows)

    # Yardsticks: a read-only stream over the same bytes, and a copy (read + write).
    ones = torch.ones(as_float32_matrix(weight).shape[1], dtype=torch.float32, device=device)
    read_fns = {"int64-sum": lambda w: as_int64_flat(w).sum()}
    if cuda:  # the weight's own dtype too (16-byte loads of bf16 / fp16; the int64 sum alone flattered, #69)
        read_fns["dtype-sum"] = lambda w: w.sum(dtype=torch.float32)
    else:  # torch's int64 sum and float32 mv differ a lot on CPU: keep the faster
        read_fns["float32-mv"] = lambda w: torch.mv(as_float32_matrix(w), ones)
    copy_dst = torch.empty_like(weight)

    def yardsticks():
        best = None
        for name, fn in read_fns.items():
            times, _ = time_calls(fn, buffers, cfg.steps, cfg.warmup, budget_s, cuda)
            row = _row("stream-read", None, times, nbytes, common)
            row["stream_method"] = name
            if best is None or row["median_us"] < best["median_us"]:
                best = row
        times, _ = time_calls(lambda w: copy_dst.copy_(w), buffers, cfg.steps, cfg.warmup, budget_s, cuda)
        copy = _row("d2d-copy", None, times, 2 * nbytes, common)  # counts the bytes read and written
        copy["stream_method"] = "copy_"
        return best, copy

    first = yardsticks()
    inv_t = 0.0 if cfg.temperature == 0 else 1.0 / cfg.temperature
    timed = []
    if cfg.op == "sample":
        gumbel, multinomial, (fi_fn, fi_skip) = samplers
    cpu_path = "auto" if cuda else cfg.cpu_path  # --cpu-path: the fused-kernel rows' forced CPU path
    for batch in cfg.batches:
        hidden = hidden_all[:batch].to(dtype).to(device)
        temps = torch.full((batch,), float(cfg.temperature), dtype=torch.float32, device=device)
        methods = []  # (name, fn(w) -> ids or keys, forced path, output is keys)
        noise_kw, vllm_ids = {}, None  # --noise vllm: the fused rows' noise=; the vllm-gumbel-logits ids
        lp = cfg.log_probs
        ids_of = (lambda out: out[0]) if lp else (lambda out: out)  # noqa: E731  (ids / keys of a (x, log-probs) pair)
        step_kw = {"return_log_probs": True} if lp else {}
        if cfg.op == "argmax":
            fused = lambda w: ids_of(shard_argmax(hidden, w, log_partition=lp, path=cpu_path))  # noqa: E731
            methods += [
                (
                    "torch-matmul-max",
                    (lambda w: _torch_best(hidden, w, 1, True)[:, 0])
                    if lp
                    else (lambda w: (hidden @ w.T).max(dim=1).indices),
                    None,
                    False,
                ),
                ("fused-kernel", fused, None, True),
                ("lm-head-step", lambda w: ids_of(lm_head_argmax(hidden, w, group=group, **step_kw)), None, False),
            ]
        elif cfg.op == "topk":
            fused = lambda w: ids_of(shard_topk(hidden, w, cfg.k, log_partition=lp, path=cpu_path))  # noqa: E731
            methods += [
                ("torch-matmul-topk", lambda w: _torch_best(hidden, w, cfg.k, lp), None, False),
                ("fused-kernel", fused, None, True),
                ("lm-head-step", lambda w: lm_head_topk(hidden, w, cfg.k, group=group, **step_kw)[0], None, False),
            ]
        else:
            if cfg.noise == "vllm":  # row b: seed --seed + b, position SAMPLE_OFFSET + b
                rows_b = torch.arange(batch, dtype=torch.int64, device=device)
                noise_kw["noise"] = vllm_noise(rows_b + cfg.seed, rows_b + SAMPLE_OFFSET)
            fused = lambda w: ids_of(  # noqa: E731
                shard_sample(hidden, w, temps, cfg.seed, SAMPLE_OFFSET, log_partition=lp, path=cpu_path, **noise_kw)
            )
            methods += [
                ("gumbel-logits", lambda w: gumbel(hidden, w, inv_t), None, False),
                ("compiled-multinomial", lambda w: multinomial(hidden, w, inv_t), None, False),
            ]
            if noise_kw:
                vllm_fn = lambda w: vllm_gumbel_logits_sample(hidden, w, temps, noise_kw["noise"])  # noqa: E731
                methods.append(("vllm-gumbel-logits", vllm_fn, None, False))
            if fi_fn is not None:
                methods.append(("flashinfer", lambda w: fi_fn(hidden, w, inv_t), None, False))
            else:
                timed.append(dict(_row("flashinfer", batch, [], nbytes, common), skip_reason=fi_skip))
            methods += [
                ("fused-kernel", fused, None, True),
                (
                    "lm-head-step",
                    lambda w: ids_of(
                        lm_head_sample(
                            hidden,
                            w,
                            temperature=cfg.temperature,
                            seed=cfg.seed,
                            offset=SAMPLE_OFFSET,
                            group=group,
                            **step_kw,
                            **noise_kw,
                        )
                    ),
                    None,
                    False,
                ),
            ]
        if cuda and dtype in (torch.bfloat16, torch.float16) and not lp:
            forced = {
                "argmax": lambda w, p: shard_argmax(hidden, w, path=p),
                "topk": lambda w, p: shard_topk(hidden, w, cfg.k, path=p),
                "sample": lambda w, p: shard_sample(hidden, w, temps, cfg.seed, SAMPLE_OFFSET, path=p, **noise_kw),
            }[cfg.op]
            methods += [
                (name, lambda w, p=path: forced(w, p), path, True)
                for path, name in CUDA_PATH_METHODS.items()
                if (path != "simt" or batch <= SIMT_MAX_BATCH)
                and (path == "gemm" or cfg.noise != "vllm")
                and (path != "gemm" or cfg.op != "topk")  # (top-k has no gemm path)
            ]
        for method, fn, path, keys in methods:
            print(f"  {method} tp={tp} B={batch} ...", file=sys.stderr)
            if method in ("gumbel-logits", "compiled-multinomial"):
                fn(buffers[0])  # compile (or fall back) outside the timed calls
            times, out = time_calls(fn, buffers, cfg.steps, cfg.warmup, budget_s, cuda)
            ids = decode_keys(out)[0] if keys else out
            row = _row(method, batch, times, nbytes, common)
            row["cuda_path"] = path if path is not None else ("auto" if cuda else None)
            if not cuda and method in ("fused-kernel", "lm-head-step"):  # the CPU path run (the step: auto's)
                row["cpu_path"] = cpu_path_of(cpu_path if method == "fused-kernel" else "auto", cfg.dtype)
            if reference is not None:
                row["agree"] = (ids.cpu() == reference[:batch]).reshape(batch, -1).all(dim=1).double().mean().item()
            if method == "vllm-gumbel-logits":
                vllm_ids = ids.cpu()
            elif vllm_ids is not None and method in OUR_METHODS:
                row["agree_vllm"] = (ids.cpu() == vllm_ids).double().mean().item()
            if method == "gumbel-logits":
                row["note"] = gumbel.note
            elif method == "compiled-multinomial":
                row["note"] = multinomial.note
            timed.append(row)
    second = yardsticks()
    stream = min(first[0], second[0], key=lambda r: r["median_us"])
    copy = min(first[1], second[1], key=lambda r: r["median_us"])
    return [stream, copy] + timed


def _torch_best(hidden, w, k, log_probs):
    """The torch baseline: matmul, top-k ids (and, with log_probs, their
    log-probabilities: a float32 logsumexp over the logits, as vLLM's
    get_top_k_tokens(return_log_probs=True) computes them)."""
    logits = hidden @ w.T
    top = logits.topk(k, dim=1)
    if log_probs:
        top.values.float() - torch.logsumexp(logits.float(), dim=1, keepdim=True)
    return top.indices


def annotate(rows: list[dict], op: str) -> None:
    """Fill the derived columns of ``--kernel-only`` rows in place, per
    (shape, tp, rows) group, from its ``stream-read``, ``d2d-copy`` and the
    run's ``gemm-peak`` rows:

    * ``gbps`` (weight bytes / median), ``tflops`` (2·B·rows·H / median);
    * ``fraction_of_stream`` = gbps / stream-read gbps (read-only),
      ``fraction_of_copy`` = gbps / d2d-copy gbps (read + write bytes);
    * ``roofline_us`` = max(weight bytes / stream-read bandwidth, flops / GEMM
      rate) and ``fraction_of_roofline`` = roofline_us / median;
    * ``speedup_vs_<baseline>`` = baseline median / this median, same batch
      (rival.BASELINES; ``speedup_vs_gemm_keys`` on CUDA for the auto row);
    * ``flashsampling_h200``: FlashSampling's published ratios for our rows'
      cells that have one (rival.published_cells), else ``{}``.
    """
    from .rival import BASELINES, OUR_METHODS, published_cells, roofline_us, step_flops

    gemm = next((r for r in rows if r["method"] == "gemm-peak"), None)
    groups = {}
    for r in rows:
        if r["method"] != "gemm-peak":
            groups.setdefault((r["shape"], r["tp"], r["rows"]), []).append(r)
    for group_rows in groups.values():
        stream = next((r for r in group_rows if r["method"] == "stream-read"), None)
        copy = next((r for r in group_rows if r["method"] == "d2d-copy"), None)
        by_batch = {}
        for r in group_rows:
            if r.get("batch") is not None and r.get("median_us") is not None:
                by_batch.setdefault(r["batch"], {})[r["method"]] = r["median_us"]
        for r in group_rows:
            median = r.get("median_us")
            if stream is not None and r.get("gbps") is not None:
                r["fraction_of_stream"] = r["gbps"] / stream["gbps"]
                if copy is not None and r["method"] != "d2d-copy":
                    r["fraction_of_copy"] = r["gbps"] / copy["gbps"]
            if r.get("batch") is None:
                continue
            shard_bytes = r["weight_bytes"]
            flops = step_flops(r["batch"], r["rows"], r["hidden"])
            r["flops"] = flops
            if stream is not None and gemm is not None:
                r["roofline_us"] = roofline_us(shard_bytes, flops, stream["gbps"], gemm["tflops"])
            if median is None:
                continue
            r["tflops"] = flops / (median * 1e-6) / 1e12
            if r.get("roofline_us") is not None:
                r["fraction_of_roofline"] = r["roofline_us"] / median
            medians = by_batch.get(r["batch"], {})
            for method, (column, _, _) in BASELINES.items():
                if method in medians:
                    r[column] = medians[method] / median
            if r["method"] == "fused-kernel" and "gemm-keys" in medians:
                r["speedup_vs_gemm_keys"] = medians["gemm-keys"] / median
            if r["method"] in OUR_METHODS:
                r["flashsampling_h200"] = published_cells(r["vocab"], r["hidden"], r["tp"], r["batch"], op)


def _world_size_1_group(cuda: bool):
    """(group, created): a world-size-1 process group (NCCL on CUDA, gloo on
    CPU) for the ``lm-head-step`` rows; the existing one when this process
    already runs in a single-rank group. A multi-rank group is not used: the
    kernel-only rows are one process's local step."""
    if dist.is_initialized():
        if dist.get_world_size() == 1:
            return dist.group.WORLD, False
        raise RuntimeError("--kernel-only runs in one process; it was started in a multi-rank process group")
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    return dist.group.WORLD, True


def _row(method, batch, times, nbytes, common) -> dict:
    """One result row; ``times`` empty gives a row without figures (a skipped method)."""
    times_us = np.array(times) * 1e6
    median = float(np.median(times_us)) if len(times) else None
    return dict(
        method=method,
        batch=batch,
        **common,
        steps=len(times),
        timing=getattr(times, "timing", "host"),
        median_us=median,
        p25_us=float(np.percentile(times_us, 25)) if len(times) else None,
        p75_us=float(np.percentile(times_us, 75)) if len(times) else None,
        p90_us=float(np.percentile(times_us, 90)) if len(times) else None,
        weight_bytes=nbytes,
        gbps=nbytes / (median * 1e-6) / 1e9 if median else None,
        fraction_of_stream=None,
        fraction_of_roofline=None,
        speedup_vs_torch=None,
        agree=None,
    )
