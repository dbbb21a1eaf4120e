"""localargmax/envs.py: the registry of LOCALARGMAX_* variables."""

import pytest


def test_envs_registry_reads_once_and_parses(monkeypatch):
    """Every LOCALARGMAX_* knob is in localargmax.envs with a default and a
    meaning; values are read once (until reload) and a bad value names the
    variable."""
    from localargmax import envs

    assert all(k.startswith("LOCALARGMAX_") and knob.meaning for k, knob in envs.KNOBS.items())
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "1")
    envs.reload()
    assert envs.LOCALARGMAX_DEBUG is True
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "0")
    assert envs.LOCALARGMAX_DEBUG is True  # cached
    envs.reload()
    assert envs.LOCALARGMAX_DEBUG is False
    monkeypatch.setenv("LOCALARGMAX_DEBUG", "maybe")
    envs.reload()
    with pytest.raises(ValueError, match="LOCALARGMAX_DEBUG='maybe'"):
        _ = envs.LOCALARGMAX_DEBUG
    monkeypatch.delenv("LOCALARGMAX_DEBUG")
    envs.reload()
    with pytest.raises(AttributeError):
        _ = envs.LOCALARGMAX_NOT_A_KNOB
