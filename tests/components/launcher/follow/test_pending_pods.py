"""Pods stuck Pending are reported with the scheduler's or kubelet's reason, and fail the task in time."""

from __future__ import annotations

import logging
import time

import pytest

from components.launcher.follow.pods import PodsStuckPending
from tests.components.launcher.follow.test_launcher import NAME, launcher_for, manifest
from tests.components.launcher.kube_cluster import UNSCHEDULABLE
from tests.components.launcher.kube_standin import KubeStandIn


def pending_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if " is Pending: " in r.getMessage()]


def test_an_unschedulable_pod_is_reported_and_fails_the_task_at_the_pending_limit(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    with KubeStandIn(pod_problem="unschedulable") as standin:
        started = time.time()
        with pytest.raises(PodsStuckPending) as err:
            launcher_for(standin, pending_timeout_seconds=3).run(manifest(), timeout=60)
        elapsed = time.time() - started
        assert standin.jobs == {}  # deleted
    message = str(err.value)
    assert f"pod {NAME}-master-0 stayed Pending for" in message and "pending limit 3 s" in message
    assert "Unschedulable: 0/4 nodes are available" in message and "3 Insufficient nvidia.com/gpu" in message
    assert message.endswith(f"PyTorchJob ml/{NAME} deleted")
    assert 3 <= elapsed < 10
    # One clear line, logged once although the pod was looked at every second.
    assert pending_lines(caplog) == [f"pod {NAME}-master-0 is Pending: Unschedulable: {UNSCHEDULABLE}"]
    record = next(r for r in caplog.records if " is Pending: " in r.getMessage())
    assert record.created - started < 3  # reported long before the limit (on a cluster: within one poll)


def test_an_image_that_cannot_be_pulled_is_reported_with_the_registrys_answer(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    image = "registry.corp/ml/alignflow-trainer:no-such-tag"
    with KubeStandIn(pod_problem="image-pull", step_seconds=0.4) as standin:
        with pytest.raises(PodsStuckPending, match="ImagePullBackOff: Back-off pulling image") as err:
            launcher_for(standin, pending_timeout_seconds=2.5).run(manifest(image=image), timeout=60)
        assert standin.jobs == {}
    assert f'Failed to pull image "{image}": rpc error: code = NotFound' in str(err.value)
    lines = pending_lines(caplog)
    assert lines and all(line.startswith(f"pod {NAME}-master-0 is Pending: ") for line in lines)
    assert any("ErrImagePull" in line or "ImagePullBackOff" in line for line in lines)


def test_every_stuck_pod_of_a_multi_node_job_is_reported(caplog):
    caplog.set_level(logging.INFO, logger="components.launcher")
    with KubeStandIn(pod_problem="unschedulable") as standin:
        with pytest.raises(PodsStuckPending):
            launcher_for(standin, pending_timeout_seconds=1.5).run(manifest(num_nodes=2), timeout=60)
    reported = {line.split(" is Pending")[0] for line in pending_lines(caplog)}
    assert reported == {f"pod {NAME}-worker-0", f"pod {NAME}-worker-1"}
