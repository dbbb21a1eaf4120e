"""``localargmax-bench --host-time`` (issue #65 item 4): the bare op, the
planned step, the step and vLLM's own local argmax side by side, with their
dispatched ops; JSON a script can read, verdicts that say "within noise"
when the repeats' spreads overlap."""

from __future__ import annotations

import json

from localargmax.bench import host_time
from localargmax.bench.cli import main


def test_host_time_json(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert main(["--host-time", "--batch", "1,3", "--steps", "20", "--repeats", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("localargmax-bench --host-time")
    assert doc["env"]["cpu"]
    rows = doc["rows"]
    assert {(r["batch"], r["method"]) for r in rows} == {(b, m) for b in (1, 3) for m in host_time.METHODS}
    for r in rows:
        assert r["us_min"] <= r["us_per_call"] <= r["us_max"]
        assert r["ops_device_path"] == len(r["ops_device_path_names"])
        if r["method"] == "planned-step":
            assert r["ops_device_path"] <= 4 and r["ops_host_path"] <= 3, r
            assert r["ops_device_path_names"] == ["step_frame", "merge_frames", "_assert_async"]
        if r["method"] == "fused-op":
            assert r["over_fused_op_us"] == 0
    assert len(doc["verdicts"]) == 2
    assert "planned-step" in capsys.readouterr().out


def test_host_time_verdict_says_within_noise_when_spreads_overlap():
    def row(method, med, lo, hi):
        return {"batch": 1, "method": method, "us_per_call": med, "us_min": lo, "us_max": hi,
                "over_fused_op_us": med - 10}  # fmt: skip

    clear = host_time.verdict([row("fused-op", 10, 9, 11), row("planned-step", 14, 13, 15)])
    assert clear == ["B=1: planned step over the bare op 4 µs <= 15.0 µs"]
    over = host_time.verdict([row("fused-op", 10, 9, 11), row("planned-step", 40, 39, 41)])
    assert "> 15.0 µs" in over[0]
    noisy = host_time.verdict([row("fused-op", 10, 5, 20), row("planned-step", 24, 20, 40)])
    assert "within noise" in noisy[0] and "--repeats" in noisy[0]


def test_host_time_refuses_other_modes(capsys):
    assert main(["--host-time", "--op", "topk"]) == 2
    assert "--host-time" in capsys.readouterr().err
