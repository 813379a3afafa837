"""The PyTorchJob kind (`kubeflow.org/v1`, the Training Operator v1) behind the launcher's `JobKind`.

The manifest is `manifest.py`'s; it is created with the Kubernetes client (a 409 means a retried task
finds the job its first attempt created, and re-attaches), followed by list + watch (`watch.py`),
and its pods are the operator's (`training.kubeflow.org/job-name=<job>`, replica type and index as
labels). The trainer's log is the `pytorch` container of master-0, or of worker-0 in an elastic job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from components.launcher.kinds.interface import JobFollower, JobKind, JobState
from components.launcher.kinds.pytorchjob.api import GROUP, KIND, PLURAL, VERSION
from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.kinds.pytorchjob.watch import JobWatcher, job_phase
from components.launcher.pod.spec import JobSpec
from components.launcher.shared.retry import RetryPolicy
from trainer.errors import LaunchError

logger = logging.getLogger(__name__)

JOB_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


class PyTorchJobFollower(JobFollower):
    """The job's conditions through list + watch (one watch request per call)."""

    def __init__(self, custom: Any, namespace: str, name: str, retry: RetryPolicy) -> None:
        self.watcher = JobWatcher(custom, namespace, name, retry)

    def states(self, seconds: float) -> Iterator[JobState]:
        for job in self.watcher.watch(seconds):
            yield JobState(job_phase(job))


class PyTorchJobKind(JobKind):
    """PyTorchJobs through the Kubernetes API.

    Args:
        api_client: A configured `kubernetes.client.ApiClient`.
    """

    kind = KIND
    container = "pytorch"  # the operator finds the training container by this name

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def build(self, spec: JobSpec) -> dict:
        return build_pytorchjob(spec)

    def identity(self, request: dict) -> tuple[str, str]:
        return request["metadata"]["namespace"], request["metadata"]["name"]

    def create(self, request: dict, retry: RetryPolicy) -> bool:
        from kubernetes.client.exceptions import ApiException

        namespace, name = self.identity(request)
        try:
            retry.call(self.custom.create_namespaced_custom_object, f"create PyTorchJob {name}",
                       GROUP, VERSION, namespace, PLURAL, request)
            logger.info("PyTorchJob %s/%s created", namespace, name)
            return False
        except ApiException as err:
            if err.status != 409:
                raise LaunchError(f"cannot create PyTorchJob {namespace}/{name}: {err.status} {err.reason}: "
                                  f"{err.body}") from err
        logger.info("PyTorchJob %s/%s exists already (a retried task): re-attaching", namespace, name)
        retry.call(self.custom.get_namespaced_custom_object, f"get PyTorchJob {name}",
                   GROUP, VERSION, namespace, PLURAL, name)
        return True

    def follower(self, namespace: str, name: str, retry: RetryPolicy) -> JobFollower:
        return PyTorchJobFollower(self.custom, namespace, name, retry)

    def pod_selector(self, name: str) -> str:
        return f"{JOB_LABEL}={name}"

    def rank_zero_pod(self, pods: list) -> str | None:
        """master-0, else worker-0 (an elastic job has Workers only); None before it starts."""
        for wanted in (("master", "0"), ("worker", "0")):
            for pod in pods:
                labels = pod.metadata.labels or {}
                if (labels.get(REPLICA_TYPE_LABEL, ""), labels.get(REPLICA_INDEX_LABEL, "")) == wanted \
                        and pod.status is not None and pod.status.phase != "Pending":
                    return pod.metadata.name
        return None

    def log_tail(self, namespace: str, name: str, lines: int) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=self.pod_selector(name)).items
            pod = self.rank_zero_pod(pods)
            if pod is None:
                return "(no started master or worker-0 pod found)"
            return self.core.read_namespaced_pod_log(pod, namespace, container=self.container,
                                                     tail_lines=lines).rstrip("\n")
        except ApiException as err:
            return f"(trainer log unavailable: {err.status} {err.reason})"

    def delete(self, namespace: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            RetryPolicy(max_retries=3).call(self.custom.delete_namespaced_custom_object, f"delete PyTorchJob {name}",
                                            GROUP, VERSION, namespace, PLURAL, name)
            logger.info("PyTorchJob %s/%s deleted", namespace, name)
        except ApiException as err:
            if err.status != 404:
                logger.warning("could not delete PyTorchJob %s/%s: %s %s", namespace, name, err.status, err.reason)
        except LaunchError as err:
            logger.warning("could not delete PyTorchJob %s/%s: %s", namespace, name, err)

    def run_jobs(self, namespace: str, run_label: str, retry: RetryPolicy) -> list[str]:
        jobs = retry.call(self.custom.list_namespaced_custom_object, "list the run's PyTorchJobs", GROUP,
                          VERSION, namespace, PLURAL, label_selector=f"alignflow/run={run_label}")
        return [job["metadata"]["name"] for job in jobs.get("items", [])]
