"""A pytest plugin for bench/gpu_check.sh (``-p pytest_alarm`` with bench/ on
PYTHONPATH), for a run that must end inside a fixed budget:

* ``--alarm-timeout SECONDS``: a per-test time limit by SIGALRM, for machines
  without pytest-timeout (the option is ignored when 0 or absent). A test past
  its limit fails with ``TimeoutError`` and the run goes on. Like
  pytest-timeout's signal method it cannot interrupt a call stuck inside C code
  (a hung kernel); the step's own ``timeout`` is the backstop for that.
* SIGTERM (what ``timeout`` sends when the whole step runs out) becomes
  KeyboardInterrupt, so pytest stops cleanly and still writes the junit XML of
  the tests it ran.
"""

from __future__ import annotations

import signal

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--alarm-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fail a test that runs longer than this (SIGALRM; 0 = off)",
    )


def pytest_configure(config):
    def on_term(signum, frame):
        raise KeyboardInterrupt("SIGTERM: the check's time budget for the tests ran out")

    signal.signal(signal.SIGTERM, on_term)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    seconds = item.config.getoption("--alarm-timeout")
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"{item.nodeid} ran past --alarm-timeout={seconds:g}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
