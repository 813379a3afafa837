"""Signals become a stop at the next step boundary; the grace watchdog bounds how long that may take."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.lifecycle import preemption

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def handlers():
    previous = signal.getsignal(signal.SIGTERM)
    assert preemption.install(grace_seconds=60)
    yield
    preemption.install(grace_seconds=60)  # forget the signal and cancel its watchdog
    preemption.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigterm_is_recorded_not_fatal_and_stops_with_143(handlers):
    assert not preemption.stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # the handler runs between bytecodes of the main thread

    assert preemption.signal_received() == signal.SIGTERM
    assert not preemption.stopped_by_signal()  # no loop has acted on it yet
    assert preemption.stop_requested()
    assert preemption.stopped_by_signal() and preemption.exit_code() == 143


def test_sigint_exits_130(handlers):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)
    assert preemption.stop_requested() and preemption.exit_code() == 130


def test_a_stop_that_outlasts_the_grace_period_exits_with_the_signal_status():
    script = ("import os, signal, time\n"
              "from trainer.lifecycle import preemption\n"
              "preemption.install(grace_seconds=1)\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "time.sleep(60)  # a step or a save that never ends\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143
    assert time.monotonic() - started < 30
    assert "grace period" in done.stderr and "previous complete checkpoint" in done.stderr
