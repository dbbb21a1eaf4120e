"""bench/cpu_paths.py on a tiny shard: the JSON a script reads (every path's
row, the ids checked against the first path's), and a clear exit where oneDNN
cannot prepack the weight on this CPU (bf16 on an AVX2-only CPU: was a
traceback)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import cpu_paths


def _args(tmp_path, paths, dtype="float32"):
    return [
        *("--rows 200 --hidden 48 --batch 1,3 --rounds 1 --steps 1 --threads 1".split()),
        *("--dtype", dtype, "--paths", paths, "--json", str(tmp_path / "out.json")),
    ]


def test_json_rows_per_path_and_batch(tmp_path):
    assert cpu_paths.main(_args(tmp_path, "generic,torch")) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    got = {(r["path"], r["batch"]) for r in doc["rows"]}
    assert got == {("generic", 1), ("generic", 3), ("torch", 1), ("torch", 3)}
    for r in doc["rows"]:
        assert r["median_us"] > 0 and r["samples"] == 1
        assert r["keys_equal_first"] is True  # float32 on a random shard: torch's ids are the kernel's
    assert doc["command"].startswith("PYTHONPATH=. python bench/cpu_paths.py --rows 200")
    assert len(doc["env"]["load_average"]) == 3


def test_prepacked_refused_with_the_reason(tmp_path, monkeypatch):
    def refuse(weight, batch):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw\nmore")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    with pytest.raises(SystemExit) as e:
        cpu_paths.main(_args(tmp_path, "generic,onednn-prepacked", "bfloat16"))
    msg = str(e.value)
    assert "--paths onednn-prepacked" in msg and "bfloat16" in msg and "avx512bw" in msg
    assert "more" not in msg and "leave it out of --paths" in msg
    assert not (tmp_path / "out.json").exists()
