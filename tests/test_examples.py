"""examples/lm_head_argmax_tp.py, the README's API example on several ranks:
under torchrun with two processes (env://, gloo) and as one process, each
rank's ids judged against the float64 argmax of the full, unsharded lm_head.
The run is killed (its whole session) if it does not finish in time."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.launch import free_port
from tests.support.reference import check_against_reference

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "lm_head_argmax_tp.py"
LINE = re.compile(r"rank (\d+)/(\d+): vocab rows \[(\d+), (\d+)\), ids (\[[\d, ]*\]), identical to the unsharded")


def _run(cmd, timeout=240):
    """Run ``cmd`` in its own session; on timeout kill the session (torchrun and its ranks)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (a hang):\n{out[-3000:]}")
    return proc.returncode, out


def _problem():
    spec = importlib.util.spec_from_file_location("lm_head_argmax_tp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.problem()


@pytest.mark.parametrize("nproc", [2, 1])
def test_tp_example_runs_under_torchrun(nproc):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={free_port()}"]
    rc, out = _run([*cmd, str(EXAMPLE)])
    assert rc == 0, out[-3000:]
    ranks = {int(m[1]): m for m in LINE.finditer(out)}
    assert sorted(ranks) == list(range(nproc)) and all(int(m[2]) == nproc for m in ranks.values()), out[-3000:]
    rows = sorted((int(m[3]), int(m[4])) for m in ranks.values())
    full_lm_head, hidden = _problem()
    assert rows[0][0] == 0 and rows[-1][1] == full_lm_head.shape[0], rows  # the shards cover the vocabulary
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), rows
    ids = {m[5] for m in ranks.values()}
    assert len(ids) == 1, f"ranks disagree: {ids}"
    check_against_reference(torch.tensor(json.loads(ids.pop())), hidden, full_lm_head, min_clear_fraction=1.0)


def test_tp_example_runs_as_one_process():
    rc, out = _run([sys.executable, str(EXAMPLE)])
    assert rc == 0 and re.search(r"rank 0/1: .*identical to the unsharded argmax: yes", out), out[-3000:]


def test_readme_points_to_the_tp_example():
    assert "examples/lm_head_argmax_tp.py" in (ROOT / "README.md").read_text()
