"""Without MLFLOW_TRACKING_URI, a pod whose working directory it cannot write (a read-only root filesystem, or
an image WORKDIR owned by root) still tracks, to $TMPDIR with one warning, or, where nothing is writable, trains
untracked with one warning instead of MLflow's minutes of retries.

The trainer's tracker is built in a private mount namespace where its working directory is a read-only bind
mount (what `readOnlyRootFilesystem` gives a pod); that needs root and `unshare`, and the tests skip elsewhere.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
# Builds rank 0's tracker the way every stage does, logs one metric and closes it.
SCRIPT = """
import logging, pathlib, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
from trainer.config.sections import TrackingConfig
from trainer.tracking.tracker import build_tracker
out = pathlib.Path(sys.argv[1])
tracker = build_tracker(out, True, TrackingConfig(backend="mlflow", experiment_name="fallback"), "sft")
tracker.log_metrics({"loss": 1.5}, step=1)
tracker.close()
print("trackers:", [type(t).__name__ for t in tracker.trackers])
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare for a read-only mount")


@pytest.fixture
def pod_folders(tmp_path):
    folders = {name: tmp_path / name for name in ("workdir", "tmp", "out", "home")}
    for folder in folders.values():
        folder.mkdir()
    return folders


def run_in_pod(folders: dict[str, Path], read_only: tuple[str, ...]) -> subprocess.CompletedProcess:
    """The tracker script with `read_only` folders mounted read-only, in the working directory `workdir`."""
    mounts = " && ".join(f"mount --bind {shlex.quote(str(folders[name]))} {shlex.quote(str(folders[name]))} && "
                         f"mount -o remount,ro,bind {shlex.quote(str(folders[name]))}" for name in read_only)
    command = shlex.join([sys.executable, "-c", SCRIPT, str(folders["out"])])
    env = {"PATH": os.environ["PATH"], "HOME": str(folders["home"]), "TMPDIR": str(folders["tmp"]),
           "PYTHONPATH": str(ROOT)}
    return subprocess.run(["unshare", "--mount", "sh", "-c", f"{mounts} && cd {shlex.quote(str(folders['workdir']))}"
                           f" && exec {command}"], env=env, capture_output=True, text=True, timeout=240)


def test_an_unwritable_working_directory_tracks_to_tmpdir_with_one_warning(pod_folders):
    done = run_in_pod(pod_folders, read_only=("workdir",))
    assert done.returncode == 0, done.stderr[-3000:]
    database = pod_folders["tmp"] / "mlflow.db"
    warnings = [line for line in done.stderr.splitlines() if "no MLFLOW_TRACKING_URI" in line]
    assert len(warnings) == 1 and f"sqlite:///{database}" in warnings[0] and "lost with the pod" in warnings[0]
    assert "MlflowTracker" in done.stdout and not (pod_folders["workdir"] / "mlflow.db").exists()

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{database}")
    [run] = client.search_runs([client.get_experiment_by_name("fallback").experiment_id])
    assert [metric.value for metric in client.get_metric_history(run.info.run_id, "loss")] == [1.5]


def test_nowhere_writable_trains_untracked_with_one_warning(pod_folders):
    done = run_in_pod(pod_folders, read_only=("workdir", "tmp"))
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "MLflow tracking disabled" in line]
    assert len(warnings) == 1 and "set MLFLOW_TRACKING_URI" in warnings[0]
    assert str(pod_folders["workdir"]) in warnings[0] and str(pod_folders["tmp"]) in warnings[0]
    assert "trackers: ['JsonlTracker']" in done.stdout  # metrics.jsonl still gets every value
    assert (pod_folders["out"] / "metrics.jsonl").read_text().strip()

