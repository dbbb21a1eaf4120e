"""bench/vllm_engine.py's report, without vLLM: repeats summed and shown as a
range, and the token check read against vllm-local-argmax (the engines
themselves run in tests/test_vllm_engine.py, with vLLM's CPU build)."""

from __future__ import annotations

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


def test_summed_adds_numbers_and_keeps_the_rest():
    got = vllm_engine._summed(
        [
            {"draft head s": 1.5, "draft head calls": 4, "plugin active": True, "plugin stats": {"a": 1}},
            {"draft head s": 0.5, "draft head calls": 6, "plugin active": True, "plugin stats": {"a": 2}},
        ]
    )
    assert got == {"draft head s": 2.0, "draft head calls": 10, "plugin active": True, "plugin stats": {"a": 2}}


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
    with pytest.raises(SystemExit) as exit_:
        vllm_engine.main(["--repeats", "0"])
    assert exit_.value.code == 2
