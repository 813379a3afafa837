"""The trainer's log is copied into the component's log while the job runs, each line once."""

from __future__ import annotations

import logging
import time

import pytest

from components.launcher.follow.pods import LogFollower
from tests.components.launcher.follow.test_launcher import NAME, launcher_for, manifest
from tests.components.launcher.kube_standin import KubeStandIn
from trainer.errors import LaunchError

POD = f"{NAME}-master-0"


def copied(caplog) -> list[tuple[float, str]]:
    prefix = f"[{POD}] "
    return [(r.created, r.getMessage()[len(prefix):]) for r in caplog.records if r.getMessage().startswith(prefix)]


def test_the_trainers_log_is_streamed_while_the_job_runs_each_line_once(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    lines = [f"step {i} loss {1 / (i + 1):.3f}" for i in range(12)]
    # Running lasts 2.5 s and the kubelet writes one line every 0.6 s of it; the rest just before the end.
    with KubeStandIn("succeed", step_seconds=2.5, log_text="\n".join(lines)) as standin:
        outcome = launcher_for(standin).run(manifest(), timeout=60)
        log_reads = [c.query for c in standin.calls if c.path.endswith(f"/pods/{POD}/log")]
    assert outcome.phase == "Succeeded"
    assert [message for _, message in copied(caplog)] == lines  # all, in order, none twice
    finished = next(r.created for r in caplog.records if r.getMessage().endswith(": Succeeded"))
    assert copied(caplog)[0][0] < finished  # copied while running, not dumped at the end
    # Later reads ask only for the recent past (the overlap is dropped by timestamp).
    assert any("sinceSeconds" in query and query["timestamps"] == "True" for query in log_reads)


def test_a_failed_job_still_reports_its_log_tail(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    log = "\n".join(f"step {i}" for i in range(80)) + "\nCheckpointError: s3://b/ckpt/step-40: manifest missing"
    with KubeStandIn("fail", log_text=log) as standin:
        with pytest.raises(LaunchError, match="failed; last lines of its trainer") as err:
            launcher_for(standin).run(manifest(), timeout=60)
    assert str(err.value).endswith("CheckpointError: s3://b/ckpt/step-40: manifest missing")
    assert copied(caplog)[-1][1] == "CheckpointError: s3://b/ckpt/step-40: manifest missing"


def test_polls_that_overlap_copy_nothing_twice(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    with KubeStandIn("hang", step_seconds=0.2) as standin:
        from kubernetes import client

        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=standin.host)))
        launcher_for(standin).create(manifest())
        follower = LogFollower(core, "ml")
        follower.follow(POD)  # before the container starts: the kubelet answers 400, quietly skipped
        deadline = time.monotonic() + 10
        while standin.cluster.pod_states.get(("ml", POD)) != "running":
            assert time.monotonic() < deadline, "the pod never started"
            time.sleep(0.05)
        standin.write_log("ml", POD, "one\ntwo")
        follower.follow(POD)
        standin.write_log("ml", POD, "three")
        follower.follow(POD)  # reads the last 5+ seconds again: "one" and "two" come back and are dropped
        follower.follow(POD)
    assert [message for _, message in copied(caplog)] == ["one", "two", "three"]
