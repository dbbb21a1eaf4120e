"""bench/vllm_engine.py's report, without vLLM: repeats summed and shown as a
range, and the token check read against vllm-local-argmax (the engines
themselves run in tests/test_vllm_engine.py, with vLLM's CPU build)."""

from __future__ import annotations

import statistics
import sys
import types

import pytest

from bench import vllm_engine


def _run(batch, tok_s, tokens_per_s_each=None, head_s=1.0, calls=10):
    run = {
        "batch": batch,
        "seconds": 1.0,
        "output_tokens": 48,
        "tokens_per_s": tok_s,
        "workers": [{"draft head s": head_s, "draft head calls": calls, "propose s": 2.0, "propose calls": 5}],
    }
    if tokens_per_s_each is not None:
        run["tokens_per_s_each"] = tokens_per_s_each
    return run


def _report(results, repeats=1):
    return {
        "command": "python -m bench.vllm_engine",
        "date": "2026-12-07",
        "cpu": "a CPU",
        "cpu_flags": ["avx2"],
        "cores": 2,
        "vllm": "0",
        "torch": "0",
        "tp": 2,
        "dtype": "bfloat16",
        "shape": vllm_engine.SMALL,
        "num_spec": 4,
        "max_tokens": 48,
        "load_average_start": [0.1],
        "load_average_end": [0.2],
        "repeats": repeats,
        "results": results,
        "path": "x.json",
    }


def test_summed_adds_numbers_and_counters_and_keeps_the_rest():
    got = vllm_engine._summed(
        [
            {"draft head s": 1.5, "draft head calls": 4, "plugin active": True, "plugin stats": {"a": 1}},
            {"draft head s": 0.5, "draft head calls": 6, "plugin active": True, "plugin stats": {"a": 2}},
        ]
    )
    assert got == {"draft head s": 2.0, "draft head calls": 10, "plugin active": True, "plugin stats": {"a": 3}}


def test_tokens_are_checked_against_vllm_local_argmax():
    same, other = {"1": [[5, 6]]}, {"1": [[5, 7]]}
    results = {
        "none": {"tokens": other, "runs": [_run(1, 30.0)]},
        "full-gather": {"tokens": same, "runs": [_run(1, 9.0)]},
        "vllm-local-argmax": {"tokens": same, "runs": [_run(1, 10.0)]},
        "plugin": {"tokens": same, "runs": [_run(1, 12.0)], "workers": [{"cpu path": "brgemm"}]},
    }
    text = vllm_engine.markdown(_report(results))
    assert "Tokens equal to vllm-local-argmax's: full-gather, plugin; other tokens: none." in text
    assert "| plugin | 1 | 12.0 | 1.20x | 100.00 | 400.00 |" in text and "CPU path brgemm" in text
    results["plugin"]["tokens"] = other
    text = vllm_engine.markdown(_report(results))
    assert "Tokens equal to vllm-local-argmax's: full-gather; other tokens: none, plugin." in text


def test_repeats_show_their_range():
    results = {
        "vllm-local-argmax": {"tokens": {}, "runs": [_run(16, 70.0, [70.0, 60.0, 75.0])]},
        "plugin": {"tokens": {}, "runs": [_run(16, 77.0, [77.0, 80.0, 71.5])], "workers": [{}]},
    }
    text = vllm_engine.markdown(_report(results, repeats=3))
    assert "| plugin | 16 | 77.0 (71.5-80.0) | 1.10x |" in text
    assert "the median of 3 generate() calls per request count" in text
    one = vllm_engine.markdown(_report({"plugin": {"tokens": {}, "runs": [_run(1, 5.0, [5.0])], "workers": [{}]}}))
    assert "| plugin | 1 | 5.0 | - |" in one and "one generate() call per request count" in one


def test_repeats_below_one_are_refused():
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        vllm_engine.run_engine("plugin", {}, repeats=0)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--repeats", "0"], "--repeats: at least 1, got 0"),
        (["--requests", "1,x"], "--requests: comma-separated request counts of at least 1, got '1,x'"),
        (["--requests", "0"], "--requests: comma-separated request counts of at least 1, got '0'"),
        (["--methods", ","], "--methods: none given; choose from none, full-gather"),
        (["--methods", "plugin,fast"], "--methods: unknown ['fast']"),
    ],
)
def test_bad_arguments_are_refused_before_any_engine_starts(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        vllm_engine.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


class _FakeLLM:
    """vllm.LLM as _engine_main uses it, two ranks, on a fake clock: each
    timed generate() takes the next of ``durations`` seconds and adds, on rank
    r, r + 1 draft head calls (and the plugin's fused count) per request."""

    def __init__(self, clock, durations, flip_on=None):
        self.clock, self.durations, self.flip_on, self.calls = clock, iter(durations), flip_on, 0
        self.timers = [{}, {}]

    def generate(self, requests, params, use_tqdm=False):
        self.calls += 1
        if self.calls > 1:  # the first call is the warm-up
            self.clock[0] += next(self.durations)
            for rank, timers in enumerate(self.timers):
                timers["draft head calls"] = timers.get("draft head calls", 0) + (rank + 1) * len(requests)
                timers["draft head s"] = timers.get("draft head s", 0) + 0.5
        ids = [7] * params.max_tokens
        if self.calls == self.flip_on:
            ids[0] = 8
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=list(ids))]) for _ in requests]

    def collective_rpc(self, fn, args=()):
        if fn is vllm_engine._reset_timers:
            self.timers = [{}, {}]
        elif fn is vllm_engine._read_timers:
            return [
                dict(t, **{"plugin stats": {"fused": t.get("draft head calls", 0)}, "plugin active": True})
                for t in self.timers
            ]
        return [{}, {}]


def _fake_engine(monkeypatch, durations, repeats, flip_on=None):
    clock = [0.0]
    llm = _FakeLLM(clock, durations, flip_on)
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kwargs: llm
    fake.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(vllm_engine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    spec = {"batches": [1, 16], "dtype": "bfloat16", "tp": 2, "max_tokens": 48, "num_spec": 4}
    spec.update({"repeats": repeats, "method": "plugin", "paths": {"target": "t", "draft": "d"}, "breakdown": []})
    return vllm_engine._engine_main(spec), llm


@pytest.mark.parametrize("repeats", [1, 3, 4])
def test_engine_repeats_interleave_and_take_the_median(monkeypatch, repeats):
    # batch 1 takes 1, 4, 2, 3 s in its repeats, batch 16 always 2 s: interleaved, 1 / 16 / 1 / 16 ...
    ones = [1.0, 4.0, 2.0, 3.0][:repeats]
    durations = [d for one in ones for d in (one, 2.0)]
    out, llm = _fake_engine(monkeypatch, durations, repeats)
    assert llm.calls == 1 + 2 * repeats
    one, sixteen = out["runs"]
    assert one["tokens_per_s_each"] == pytest.approx([48 / d for d in ones])
    assert one["tokens_per_s"] == pytest.approx(statistics.median(48 / d for d in ones))
    assert one["seconds"] == pytest.approx(48 / one["tokens_per_s"])
    assert sixteen["tokens_per_s"] == pytest.approx(16 * 48 / 2.0) and sixteen["output_tokens"] == 16 * 48
    for rank, worker in enumerate(sixteen["workers"]):  # each rank's own timers, summed over the repeats
        calls = repeats * (rank + 1) * 16
        assert worker["draft head calls"] == calls and worker["plugin stats"] == {"fused": calls}
        assert worker["draft head s"] == pytest.approx(0.5 * repeats) and worker["plugin active"] is True


def test_engine_repeat_with_other_tokens_fails(monkeypatch):
    with pytest.raises(RuntimeError, match="16 requests gave other tokens on a repeat"):
        _fake_engine(monkeypatch, [1.0] * 6, 3, flip_on=5)  # calls: warm-up, 1, 16, 1, 16 (flipped)
