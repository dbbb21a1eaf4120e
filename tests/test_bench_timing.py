"""localargmax/bench/timing.py's control flow on a machine without a GPU:
torch.cuda's streams, events and graphs replaced by host fakes (the GPU run of
bench/gpu_check.sh measures for real). Graph capture used when it works,
back-to-back launches between events when capture fails, and the budget cut."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

from localargmax.bench import timing


class _Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class _Stream:
    def wait_stream(self, other):
        pass


class _Graph:
    replays = 0

    def replay(self):
        _Graph.replays += 1
        time.sleep(0.002)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    _Graph.replays = 0
    return monkeypatch


def test_graph_replay_times_per_call(fake_cuda):
    fake_cuda.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    calls = []
    times, out = timing.time_cuda(
        lambda b: calls.append(b) or len(calls), ["w0", "w1"], steps=100, warmup=3, budget_s=0, calls_per_replay=20
    )
    assert times.timing == "cuda_graph" and times.fallback_reason is None
    assert len(times) == 5 and _Graph.replays == 6  # one untimed upload replay, then 100 / 20 samples
    assert calls == ["w0", "w1", "w0"] + ["w1", "w0"] * 10  # warmup, then the captured calls rotate on
    assert out == 23
    assert all(0.002 / 20 <= t < 0.05 for t in times)  # seconds per call: replay time / calls


def test_capture_failure_falls_back_to_events(fake_cuda):
    @contextlib.contextmanager
    def refusing(graph):
        yield
        raise RuntimeError("operation not permitted when stream is capturing")

    fake_cuda.setattr(torch.cuda, "graph", refusing)
    calls = []
    times, out = timing.time_cuda(
        lambda b: calls.append(b) or len(calls), ["w"], steps=10, warmup=2, budget_s=0, calls_per_replay=4
    )
    assert times.timing == "events" and "RuntimeError" in times.fallback_reason
    assert len(times) == 3 and len(calls) == 2 + 4 + 3 * 4  # warmup, the failed capture, 3 samples of 4
    assert out == len(calls)


def test_budget_cuts_samples_to_at_least_three(fake_cuda):
    fake_cuda.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    times, _ = timing.time_cuda(
        lambda b: time.sleep(0.01), ["w"], steps=1000, warmup=1, budget_s=0.05, calls_per_replay=10
    )
    assert len(times) == timing.MIN_SAMPLES


def test_host_rows_say_host():
    from localargmax.bench.kernel import _row, time_calls

    times, out = time_calls(lambda w: w.sum(), [torch.ones(4)], steps=3, warmup=1, budget_s=0, cuda=False)
    assert _row("m", 1, times, 16, {})["timing"] == "host" and float(out) == 4
