"""Kubernetes mode through the real `kubernetes` client against a loopback stand-in of the API: the
job's life from creation to clean-up. API failures, Pending pods, the log and cancellation have
their own files.

A real cluster run is not part of CI (no API server can run here); see docs/cluster.md for one.
"""

from __future__ import annotations

import pytest

from components.launcher.follow.launcher import KubernetesLauncher
from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.pod.spec import JobSpec
from components.launcher.shared.retry import RetryPolicy
from tests.components.launcher.kube_standin import KubeStandIn
from trainer.errors import LaunchError

JOBS_PATH = "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs"
NAME = "af-sft-0123456789"


def manifest(num_nodes: int = 1, image: str = "alignflow/trainer:1") -> dict:
    return build_pytorchjob(JobSpec(name=NAME, stage="sft", config_uri="s3://b/sft.yaml", image=image,
                                    namespace="ml", num_nodes=num_nodes, gpus_per_node=1))


def launcher_for(standin: KubeStandIn, pending_timeout_seconds: float = 900.0) -> KubernetesLauncher:
    return launcher_for_host(standin.host, pending_timeout_seconds)


def launcher_for_host(host: str, pending_timeout_seconds: float = 900.0) -> KubernetesLauncher:
    """A launcher on the stand-in with test-sized intervals: 1 s polls, retries 0.1 s to 1 s apart."""
    from kubernetes import client

    configuration = client.Configuration(host=host)
    return KubernetesLauncher(client.ApiClient(configuration), poll_seconds=1,
                              pending_timeout_seconds=pending_timeout_seconds,
                              retry=RetryPolicy(max_retries=3, base_seconds=0.1, max_seconds=1.0))


def test_succeeded_job_returns_and_is_deleted():
    with KubeStandIn("succeed", log_text="step 1\nstep 2\ndone") as standin:
        outcome = launcher_for(standin).run(manifest(), timeout=30)
        assert (outcome.phase, outcome.reattached) == ("Succeeded", False)
        assert outcome.log_tail.endswith("done")
        assert ("POST", JOBS_PATH) in standin.requests
        assert ("DELETE", f"{JOBS_PATH}/af-sft-0123456789") in standin.requests
        assert standin.jobs == {}


def test_failed_job_fails_the_task_with_the_master_log_tail():
    log = "\n".join(f"line {i}" for i in range(100)) + "\nDataError: s3://b/train.jsonl:3: missing field 'prompt'"
    with KubeStandIn("fail", log_text=log) as standin:
        with pytest.raises(LaunchError, match="af-sft-0123456789 failed") as err:
            launcher_for(standin).run(manifest(), timeout=30)
        assert "DataError: s3://b/train.jsonl:3" in str(err.value)
        assert "line 39" not in str(err.value)  # only the tail
        assert standin.jobs == {}  # cleaned up after a failure too


def test_restarting_job_is_followed_to_its_end():
    phases: list[str] = []
    with KubeStandIn("restart", step_seconds=0.3) as standin:
        launcher = launcher_for(standin)
        launcher.create(manifest())
        final = launcher.wait("ml", "af-sft-0123456789", timeout=30, on_phase=phases.append)
    assert final == "Succeeded"
    assert "Restarting" in phases and phases[-1] == "Succeeded"


def test_wait_gives_up_at_its_own_deadline_not_the_request_timeout():
    with KubeStandIn("hang") as standin:
        with pytest.raises(LaunchError, match="did not finish within 3 s"):
            launcher_for(standin).run(manifest(), timeout=3)
        assert standin.jobs == {}


def test_retried_task_reattaches_to_the_running_job():
    with KubeStandIn("succeed", step_seconds=0.3) as standin:
        launcher = launcher_for(standin)
        launcher.create(manifest())  # the first attempt of the task, which then died
        outcome = launcher.run(manifest(), timeout=30)
        assert outcome.reattached and outcome.phase == "Succeeded"
        # Two create calls, one job: the second answered 409 and the launcher followed the first.
        assert sum(1 for method, path in standin.requests if method == "POST") == 2
        assert standin.created == [("ml", "af-sft-0123456789")]


def test_a_job_the_crd_refuses_is_a_422_and_not_retried():
    job = manifest()
    job["spec"]["runPolicy"]["backoffLimit"] = "two"
    with KubeStandIn("succeed") as standin:
        with pytest.raises(LaunchError, match=r"cannot create PyTorchJob ml/af-sft-0123456789: 422 .*"
                                              r"spec.runPolicy.backoffLimit: Invalid value"):
            launcher_for(standin).run(job, timeout=30)
        assert standin.requests == [("POST", JOBS_PATH)] and standin.created == []


def test_multi_node_jobs_are_followed_through_worker_zero():
    with KubeStandIn("succeed", log_text="worker zero speaking") as standin:
        outcome = launcher_for(standin).run(manifest(num_nodes=3), timeout=30)
        assert outcome.phase == "Succeeded" and outcome.log_tail == "worker zero speaking"


def test_exit_handler_cleanup_deletes_only_the_runs_jobs():
    def job(name: str, run: str) -> dict:
        return build_pytorchjob(JobSpec(name=name, stage="sft", config_uri="s3://b/c.yaml", image="i", namespace="ml",
                                        labels={"alignflow/run": run}))

    with KubeStandIn("hang") as standin:
        launcher = launcher_for(standin)
        for name, run in (("af-sft-a", "run-1"), ("af-dpo-b", "run-1"), ("af-sft-c", "run-2")):
            launcher.create(job(name, run))
        assert sorted(launcher.delete_run_jobs("ml", "run-1")) == ["af-dpo-b", "af-sft-a"]
        assert list(standin.jobs) == [("ml", "af-sft-c")]
