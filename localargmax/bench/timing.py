"""GPU timing without host overhead: many calls replayed from one CUDA graph.

Timing one call between two CUDA events and synchronising after each counts
the host's Python, dispatcher and launch time (15-30 us) while the GPU sits
idle; for a 40 us kernel (tp = 8) that reads 25-40% too slow. Here
``calls_per_replay`` calls (rotating over the weight buffers) are captured
into one CUDA graph and the graph is replayed between two events: one sample
is (replay time) / calls, so the GPU runs the calls back to back and no
launch gap is counted. A call that cannot be captured (a host sync inside it,
an op that refuses capture) falls back to the same calls launched back to back
between two events, still one synchronisation per sample, not per call.

:func:`time_cuda` returns a :class:`Times` whose ``timing`` says which method
produced it: ``"cuda_graph"`` or ``"events"`` (``"host"`` is the CPU timer of
``localargmax.bench.kernel.time_calls``); the benchmark writes it into every
JSON row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

CALLS_PER_REPLAY = 20
"""Calls captured into one graph (one timing sample = their mean)."""

MIN_SAMPLES = 3


class Times(list):
    """Seconds per call, one entry per sample, and how they were measured:
    ``timing`` is ``"cuda_graph"``, ``"events"`` or ``"host"``;
    ``fallback_reason`` says why graph capture was not used (else None)."""

    def __init__(self, values=(), timing: str = "host", fallback_reason: str | None = None):
        super().__init__(values)
        self.timing = timing
        self.fallback_reason = fallback_reason


def time_cuda(
    fn: Callable,
    buffers: Sequence[torch.Tensor],
    steps: int,
    warmup: int,
    budget_s: float,
    calls_per_replay: int = CALLS_PER_REPLAY,
) -> tuple[Times, object]:
    """Time ``fn(buffer)`` on the current CUDA device, rotating over ``buffers``.

    ``warmup`` untimed calls run first on a side stream (cuBLAS handles,
    workspaces, lazy init, as torch.cuda.graph capture requires); then
    ``calls = min(calls_per_replay, steps)`` calls are captured into one graph
    and replayed ``ceil(steps / calls)`` times (cut to fit ``budget_s`` when
    > 0, at least 3 replays), each replay between two events. Returns
    (:class:`Times` of seconds per call, one per replay; the last captured
    call's output, valid after the replays). On a capture failure the calls
    are launched back to back between two events instead
    (``timing="events"``).
    """
    n = len(buffers)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    out = None
    start = time.perf_counter()
    with torch.cuda.stream(stream):
        for i in range(max(warmup, 1)):
            out = fn(buffers[i % n])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - start) / max(warmup, 1)
    calls = max(1, min(calls_per_replay, steps))
    samples = max(MIN_SAMPLES, math.ceil(steps / calls))
    if budget_s > 0:
        samples = max(MIN_SAMPLES, min(samples, int(budget_s / max(per_call * calls, 1e-9))))

    def batch_of_calls():
        result = None
        for c in range(calls):
            result = fn(buffers[(warmup + c) % n])
        return result

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = batch_of_calls()
        graph.replay()  # the first replay uploads the graph: not timed
        torch.cuda.synchronize()
        return Times(_event_samples(graph.replay, samples, calls), "cuda_graph"), out
    except Exception as exc:  # noqa: BLE001  any capture failure: fall back, say why
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
    holder: list[object] = [out]

    def launch():
        holder[0] = batch_of_calls()

    times = Times(_event_samples(launch, samples, calls), "events", reason)
    return times, holder[0]


def _event_samples(launch: Callable[[], None], samples: int, calls: int) -> list[float]:
    """``samples`` times of ``launch()`` between two events, in seconds per call."""
    out = []
    for _ in range(samples):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        launch()
        end.record()
        end.synchronize()
        out.append(begin.elapsed_time(end) / 1e3 / calls)
    return out
