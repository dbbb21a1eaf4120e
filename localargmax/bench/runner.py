"""The per-rank timing loop of the multi-rank benchmark, and how ranks start.

Timing (documented in ``--help``): every timed step is preceded by a barrier
(outside the timed region); the step time is rank 0's wall time from the
barrier's return until the method's ids are ready on rank 0 (CUDA: after
``torch.cuda.synchronize()``). Because every method ends in a collective,
rank 0 cannot finish before the slowest rank has contributed its share.

``--op`` picks what a step computes: greedy ids (``argmax``), the top ``k``
ids (``topk``, tree drafting) or a sample of ``softmax(logits / T)``
(``sample``); see :data:`OP_METHODS` for the methods of each.
"""

from __future__ import annotations

import datetime
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from .. import envs, lm_head_argmax, lm_head_sample, lm_head_topk
from ..baselines import (
    FLOAT32_EXACT_INDEX_LIMIT,
    full_gather_argmax,
    full_gather_sample,
    full_gather_topk,
    unfused_local_argmax,
)
from ..collective import payload_length
from . import report
from .data import Shape, free_memory, full_weight, reference_ids, reference_topk, weight_shard
from .filtered import (
    batch_sharded_bytes,
    batch_sharded_sample,
    fallback_rows_dist,
    filtered_bytes,
    gather_filter_sample,
)

METHODS = ("full-gather", "unfused-local", "fused", "fused-allreduce")
"""The methods of the multi-rank benchmark (``--op argmax``), in table order."""

OPS = ("argmax", "topk", "sample")
"""What one step computes (``--op``)."""

OP_METHODS = {
    "argmax": METHODS,
    "topk": ("full-gather", "fused"),
    "sample": ("full-gather", "batch-sharded", "fused"),
}
"""The methods available for each op, in table order (also the default set)."""

NOISES = ("philox", "vllm")
"""``--noise``: the kernels' own Philox noise, or vLLM 0.34's (``localargmax.vllm_noise``)."""

SAMPLE_OFFSET = 0
"""Philox offset of every timed ``--op sample`` step (the seed is ``--seed``):
each step draws the same noise, so every step does the same work."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RunConfig:
    """Everything a rank needs to know about the run (picklable for spawn)."""

    tp: int
    device: str
    dtype: str
    batches: list[int]
    methods: list[str]
    steps: int
    warmup: int
    threads: int
    json_path: str | None = None
    command: list[str] = field(default_factory=list)
    progress: bool = True
    op: str = "argmax"
    k: int = 8
    temperature: float = 1.0
    seed: int = 0
    timeout: float = 60.0
    log_probs: bool = False
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    cpu_path: str = "auto"
    noise: str = "philox"

    def filters(self) -> dict:
        """``--op sample``'s filters given on the command line (``{}``: plain sampling)."""
        given = dict(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        return {name: value for name, value in given.items() if value is not None}

    def filter_values(self) -> tuple:
        """``(top_k, top_p, min_p)`` with the off values for those not given."""
        f = self.filters()
        return f.get("top_k", 0), f.get("top_p", 1.0), f.get("min_p", 0.0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def comm_bytes(method: str, batch: int, rows: int, itemsize: int, tp: int, k: int = 1):
    """``(bytes_sent_per_rank, bytes_recv_per_rank)`` of one step.

    Sent is the payload a rank contributes: the ``[batch, rows]`` logits in the
    weight dtype for full-gather, 8 bytes per row for unfused-local (two
    float32), and for fused* one int64 key per row (times ``k`` for top-k) plus
    the 24-byte header of the step's exchange (DESIGN.md, "The step's
    exchange"). Received is ``(tp - 1) * payload`` for an all-gather and
    the ring all-reduce estimate ``2 * (tp - 1) / tp * payload`` for
    fused-allreduce. batch-sharded (vLLM 0.34's all-to-all): rank 0's
    :func:`~localargmax.bench.filtered.batch_sharded_bytes`.
    """
    if method == "batch-sharded":
        return batch_sharded_bytes(batch, rows, itemsize, tp)
    if method == "full-gather":
        payload = batch * rows * itemsize
    elif method == "unfused-local":
        payload = 8 * batch
    else:
        payload = 8 * payload_length(batch, k)
    if method == "fused-allreduce":
        return payload, int(round(2 * (tp - 1) / tp * payload))
    return payload, (tp - 1) * payload


def vllm_bytes(op: str, batch: int, rows: int, itemsize: int, k: int = 1) -> int:
    """Bytes one rank sends per step in vLLM's own path (0.34 and 0.33 alike) for ``op``
    (tests/test_vllm_plugin.py counts them on vLLM's classes): argmax,
    ``LogitsProcessor.get_top_tokens``: ``8·B`` (float32 value + float32
    index); topk, ``get_top_k_tokens``: ``(itemsize + 8)·k·B`` (values in the
    weight dtype, then int64 ids; ``12·k·B`` for float32); sample: vLLM
    samples from gathered logits, ``B·rows·itemsize``."""
    if op == "topk":
        return (itemsize + 8) * k * batch
    if op == "sample":
        return batch * rows * itemsize
    return 8 * batch


def make_step(
    method: str,
    hidden,
    weight,
    layout,
    d2t,
    group,
    op: str = "argmax",
    k: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    generator=None,
    filters: dict | None = None,
):
    """A no-argument callable running one step of ``method`` for ``op`` on this
    rank, returning ids (``[B]``; ``[B, k]`` for topk). ``sample``: the fused
    step uses ``seed`` and :data:`SAMPLE_OFFSET`, full-gather draws from
    ``generator``; with ``filters`` (``top_k`` / ``top_p`` / ``min_p``) the
    fused step is ``lm_head_sample(..., **filters)`` and full-gather is
    :func:`localargmax.bench.filtered.gather_filter_sample` (vLLM's filters
    and its exponential race)."""
    kwargs = dict(vocab_start=layout.vocab_start, num_valid=layout.num_valid, d2t=d2t, group=group)
    if method not in OP_METHODS.get(op, ()):
        raise ValueError(f"method {method!r} is not available for op {op!r}; choose from {OP_METHODS.get(op, OPS)}")
    if op == "topk":
        if method == "full-gather":
            return lambda: full_gather_topk(hidden, weight, k, **kwargs)[0]
        return lambda: lm_head_topk(hidden, weight, k, **kwargs)[0]
    if op == "sample" and method == "batch-sharded":
        f = dict(top_k=0, top_p=1.0, min_p=0.0) | (filters or {})
        return lambda: batch_sharded_sample(hidden, weight, temperature=temperature, generator=generator, **f, **kwargs)
    if op == "sample" and filters:
        if method == "full-gather":
            f = dict(top_k=0, top_p=1.0, min_p=0.0) | filters
            return lambda: gather_filter_sample(
                hidden, weight, temperature=temperature, seed=seed, generator=generator, **f, **kwargs
            )
        return lambda: lm_head_sample(
            hidden, weight, temperature=temperature, seed=seed, offset=SAMPLE_OFFSET, **filters, **kwargs
        )
    if op == "sample":
        if method == "full-gather":
            return lambda: full_gather_sample(hidden, weight, temperature=temperature, generator=generator, **kwargs)
        return lambda: lm_head_sample(
            hidden, weight, temperature=temperature, seed=seed, offset=SAMPLE_OFFSET, **kwargs
        )
    if method == "full-gather":
        return lambda: full_gather_argmax(hidden, weight, **kwargs)
    if method == "unfused-local":
        return lambda: unfused_local_argmax(hidden, weight, **kwargs)
    if method == "fused":
        return lambda: lm_head_argmax(hidden, weight, reduce="all_gather", **kwargs)
    if method == "fused-allreduce":
        return lambda: lm_head_argmax(hidden, weight, reduce="all_reduce", **kwargs)
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def run_rank(local_rank: int, cfg: RunConfig, shapes: Sequence[Shape], port: int | None) -> None:
    """Entry point of one rank: join the process group (``tcp://127.0.0.1:port``
    when spawned, ``env://`` under torchrun when ``port`` is None), benchmark
    every shape, and on rank 0 print the table and write the JSON."""
    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(seconds=cfg.timeout)  # a dead rank fails every collective instead of hanging
    if port is None:
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", timeout=timeout)
    else:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=local_rank,
            world_size=cfg.tp,
            timeout=timeout,
        )
    try:
        rank = dist.get_rank()
        if port is None:  # torchrun: every rank built its inputs; make them bit-identical
            _broadcast_hidden_pools(shapes, torch.device("cuda", local_rank) if cuda else torch.device("cpu"))
        rows = benchmark_rank(rank, local_rank, cfg, shapes)
        if rank == 0:
            report.finish(rows, cfg, kernel_only=False)
        # Leave together: a rank tearing gloo down while another still uses it
        # was seen to abort ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _broadcast_hidden_pools(shapes: Sequence[Shape], device) -> None:
    for shape in shapes:
        if shape.hidden_pool is not None:
            pool = shape.hidden_pool.to(device)
            dist.broadcast(pool, src=0)
            shape.hidden_pool = pool.cpu()


def _sync_and_barrier(cuda: bool, local_rank: int):
    def barrier():
        if cuda:
            dist.barrier(device_ids=[local_rank])
            torch.cuda.synchronize()
        else:
            dist.barrier()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    return barrier, sync


def benchmark_rank(rank: int, local_rank: int, cfg: RunConfig, shapes: Sequence[Shape]) -> list[dict]:
    """Time every (shape, batch, method) of ``cfg.op`` on this rank; rank 0
    returns the rows (other ranks return ``[]``).

    Rank 0 also computes the checks: ``agree`` against the float64 reference
    (argmax: :func:`reference_ids`; topk: :func:`reference_topk`; sample: None,
    a different random stream is not comparable) and, for fused sample rows,
    ``tp_invariance`` against :func:`sample_reference`."""
    torch.set_num_threads(cfg.threads)
    tp, cuda = cfg.tp, cfg.device == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dtype = DTYPES[cfg.dtype]
    group = dist.group.WORLD
    barrier, sync = _sync_and_barrier(cuda, local_rank)
    max_batch = max(cfg.batches)
    total = len(shapes) * len(cfg.batches) * len(cfg.methods) * (cfg.warmup + cfg.steps)
    bar = None
    if rank == 0 and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=total, file=sys.stderr, unit="step", dynamic_ncols=True, leave=False)
    rows = []
    for shape in shapes:
        weight, layout = weight_shard(shape, rank, tp, dtype, device)
        d2t = shape.d2t.to(device) if shape.d2t is not None else None
        hidden_all = shape.hidden_states(max_batch)
        if bar is not None:
            bar.set_description(f"{shape.name}: reference")
        reference = single = None
        if rank == 0 and cfg.op == "argmax":
            reference = reference_ids(shape, hidden_all, dtype)
        elif rank == 0 and cfg.op == "topk":
            reference = reference_topk(shape, hidden_all, dtype, cfg.k)
        elif rank == 0 and cfg.op == "sample" and "fused" in cfg.methods:
            single = sample_reference(shape, hidden_all, dtype, device, cfg)
        filters = cfg.filters() if cfg.op == "sample" else {}
        for batch in cfg.batches:
            hidden = hidden_all[:batch].to(dtype).to(device)
            matched = need = None
            if filters:  # (collectives: every rank) the same-noise baseline's ids and the rows needing the fallback
                values = cfg.filter_values()
                matched = gather_filter_sample(
                    hidden, weight, temperature=cfg.temperature, top_k=values[0], top_p=values[1],
                    min_p=values[2], seed=cfg.seed, offset=SAMPLE_OFFSET, vocab_start=layout.vocab_start,
                    num_valid=layout.num_valid, d2t=d2t, group=group, noise="gumbel",
                ).cpu()  # fmt: skip
                need = fallback_rows_dist(
                    hidden, weight, layout, group, cfg.temperature, *values, cfg.seed, SAMPLE_OFFSET
                ).cpu()
            steps = {}
            for method in cfg.methods:
                if method == "unfused-local" and tp * layout.rows > FLOAT32_EXACT_INDEX_LIMIT:
                    if rank == 0:
                        print(
                            f"skipping unfused-local for {shape.name}: padded vocab {tp * layout.rows} >= 2**24",
                            file=sys.stderr,
                        )
                    if bar is not None:
                        bar.update(cfg.warmup + cfg.steps)
                    continue
                generator = torch.Generator(device=device).manual_seed(cfg.seed) if cfg.op == "sample" else None
                steps[method] = make_step(
                    method,
                    hidden,
                    weight,
                    layout,
                    d2t,
                    group,
                    cfg.op,
                    cfg.k,
                    cfg.temperature,
                    cfg.seed,
                    generator,
                    filters,
                )
            # Interleaved: step i of every method before step i + 1 of any, so a change of load on the
            # machine (another job starting, a frequency change) reaches every method alike.
            timings = {method: [] for method in steps}
            last = {}
            if bar is not None:
                bar.set_description(f"{shape.name} B={batch}")
            for i in range(cfg.warmup + cfg.steps):
                for method, step in steps.items():
                    barrier()
                    start = time.perf_counter()
                    last[method] = step()
                    sync()
                    elapsed = time.perf_counter() - start
                    if i >= cfg.warmup:
                        timings[method].append(elapsed)
                    if bar is not None:
                        bar.update(1)
            for method in steps:
                times, ids = timings[method], last[method]
                ids = ids.contiguous()
                gathered = [torch.empty_like(ids) for _ in range(tp)]
                dist.all_gather(gathered, ids)
                if rank != 0:
                    continue
                ids_by_rank = torch.stack([g.cpu() for g in gathered])  # [tp, B] or [tp, B, k]
                k = cfg.k if cfg.op == "topk" else 1
                sent, recv = comm_bytes(
                    method, batch, layout.rows, weight.element_size(), tp, k if method == "fused" else 1
                )
                times_us = np.array(times) * 1e6
                row = dict(
                    method=method,
                    op=cfg.op,
                    model=shape.model,
                    shape=shape.name,
                    tp=tp,
                    batch=batch,
                    vocab=shape.vocab,
                    hidden=shape.hidden,
                    draft_vocab=shape.draft_vocab,
                    rows=layout.rows,
                    dtype=cfg.dtype,
                    device=cfg.device,
                    steps=cfg.steps,
                    median_us=float(np.median(times_us)),
                    p25_us=float(np.percentile(times_us, 25)),
                    p75_us=float(np.percentile(times_us, 75)),
                    p90_us=float(np.percentile(times_us, 90)),
                    bytes_sent_per_rank=sent,
                    bytes_recv_per_rank=recv,
                    bytes_sent_vllm=vllm_bytes(cfg.op, batch, layout.rows, weight.element_size(), k),
                    speedup_vs_full_gather=None,
                    agree=_fraction_equal(ids_by_rank, reference, batch),
                )
                if cfg.op == "topk":
                    row["k"] = cfg.k
                if cfg.op == "sample":
                    row.update(
                        temperature=cfg.temperature,
                        seed=cfg.seed,
                        offset=SAMPLE_OFFSET,
                        ranks_agree=_fraction_equal(ids_by_rank, ids_by_rank[0], batch),
                        tp_invariance=_fraction_equal(ids_by_rank, single, batch) if method == "fused" else None,
                    )
                if filters:
                    top_k, top_p, min_p = cfg.filter_values()
                    row.update(top_k=top_k, top_p=top_p, min_p=min_p, fallback_share=None)
                    if method == "fused":
                        n_fallback = int(need.sum())
                        sent = filtered_bytes(batch, n_fallback, layout.rows)
                        row.update(
                            bytes_sent_per_rank=sent,
                            bytes_recv_per_rank=(tp - 1) * sent,
                            fallback_share=n_fallback / batch if batch else 0.0,
                            agree=_fraction_equal(ids_by_rank, matched, batch),
                        )
                if cfg.device == "cpu" and method in ("fused", "fused-allreduce"):
                    row["cpu_path"] = cpu_path_of(cfg.cpu_path, cfg.dtype)
                rows.append(row)
        del weight
    if bar is not None:
        bar.close()
    report.add_speedups(rows, "full-gather", "speedup_vs_full_gather")
    return rows


def cpu_path_of(path: str, dtype: str) -> str:
    """The CPU path the fused kernel runs for ``path`` (``"auto"`` or a
    forced one) and weights of ``dtype`` on this CPU
    (:func:`localargmax.kernel_path`)."""
    from ..paths import kernel_path

    return kernel_path(DTYPES[dtype], "cpu", path)


def _fraction_equal(ids_by_rank: torch.Tensor, expected: torch.Tensor | None, batch: int) -> float | None:
    """Fraction of the ``batch`` rows whose ids (all ``k`` of them, in order)
    equal ``expected`` on every rank; None when there is no ``expected``."""
    if expected is None:
        return None
    same = ids_by_rank == expected[:batch]
    return same.reshape(same.shape[0], batch, -1).all(dim=2).all(dim=0).double().mean().item()


def sample_reference(
    shape: Shape, hidden_all: torch.Tensor, dtype: torch.dtype, device, cfg: RunConfig
) -> torch.Tensor | None:
    """The tp-invariance reference of ``--op sample`` (rank 0): ``[N]`` ids of
    ``lm_head_sample(hidden, full_weight, temperature, seed, offset, d2t,
    group=None)`` on the whole unpadded lm_head in the run dtype, one process.
    Fused sampling keys its noise by the global vocab index, so every tp must
    return these ids. None (with a message) when the full matrix would take
    more than 40% of the free memory of ``device``."""
    nbytes = shape.lm_rows * shape.hidden * torch.empty((), dtype=dtype).element_size()
    free = free_memory(device)
    if nbytes > 0.4 * free:
        print(
            f"skipping tp_invariance for {shape.name}: the full lm_head ({nbytes / 2**30:.1f} GiB) does not fit "
            f"in 40% of the free memory ({free / 2**30:.1f} GiB)",
            file=sys.stderr,
        )
        return None
    weight = full_weight(shape, dtype, device)
    d2t = shape.d2t.to(device) if shape.d2t is not None else None
    ids = lm_head_sample(
        hidden_all.to(dtype).to(device),
        weight,
        temperature=cfg.temperature,
        seed=cfg.seed,
        offset=SAMPLE_OFFSET,
        d2t=d2t,
        **cfg.filters(),
    )
    return ids.cpu()


def launch(cfg: RunConfig, shapes: Sequence[Shape]) -> int:
    """Run ``cfg.tp`` ranks: in this process under torchrun (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK`` set), else spawned here. Returns an exit code.

    Spawned ranks are joined; on Ctrl-C or when one rank fails, the others are
    terminated, so no rank is left behind.
    """
    torchrun = envs.torchrun_rank()
    if torchrun is not None:
        run_rank(torchrun.local_rank, cfg, shapes, None)
        return 0
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.start_processes(run_rank, args=(cfg, shapes, port), nprocs=cfg.tp, join=False, start_method="spawn")
    try:
        while not ctx.join():
            pass
    except KeyboardInterrupt:
        print("localargmax-bench: interrupted; terminating the ranks", file=sys.stderr)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            _terminate(ctx.processes)
        finally:
            signal.signal(signal.SIGINT, previous)
        return 130
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:  # join() stopped the other ranks
        _terminate(ctx.processes)
        print(f"localargmax-bench: a rank failed:\n{exc}", file=sys.stderr)
        return 1
    return 0


def _terminate(processes) -> None:
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
