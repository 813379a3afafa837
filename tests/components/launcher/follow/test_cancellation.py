"""Cancelling a run: SIGTERM to the component's process deletes its job before the process exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.components.launcher.follow.test_launcher import JOBS_PATH, NAME, launcher_for, manifest
from tests.components.launcher.kube_standin import KubeStandIn

ROOT = Path(__file__).parents[4]


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_sigterm_to_the_component_deletes_its_job_before_exiting():
    with KubeStandIn("hang") as standin:
        # What KFP does when a run is cancelled: the task's pod, running the launcher, gets SIGTERM.
        process = subprocess.Popen([sys.executable, "-m", "tests.components.launcher.run_launcher", standin.host],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Wait until the launcher follows the running job (a watch request after the job is Running).
            wait_for(lambda: standin.cluster.steps_done.get(("ml", NAME), 0) >= 1
                     and sum(c.query.get("watch") == "True" for c in standin.calls) >= 2)
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
        finally:
            process.kill()
        assert ("DELETE", f"{JOBS_PATH}/{NAME}") in standin.requests
        assert standin.jobs == {}
    assert process.returncode == 1  # the task fails (KFP marks it cancelled)
    assert "JobCancelled: received SIGTERM: the run was cancelled" in stderr
    assert f"PyTorchJob ml/{NAME} deleted" in stderr


def test_the_previous_sigterm_handler_is_restored_after_the_run():
    def previous(signum, frame):
        pass

    original = signal.signal(signal.SIGTERM, previous)
    try:
        with KubeStandIn("succeed") as standin:
            launcher_for(standin).run(manifest(), timeout=30)
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, original)
