"""Kubernetes mode: create the PyTorchJob, wait for it with a real deadline, report, clean up.

- The job name is derived from the pipeline run and task (`derive_job_name`), so when KFP retries
  a task, `create` answers 409 and the launcher re-attaches to the job already running instead of
  starting a second one.
- Waiting watches the job and re-opens the watch until the launcher's own deadline (the upstream
  sample passed its wait timeout as the API request timeout and gave up after 600 s).
- `Succeeded` returns, `Failed` raises `LaunchError` with the tail of the master's log (the
  upstream sample reported a failed job as a success), and the job is deleted either way unless
  asked to keep it.

`kubernetes` is imported here only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.errors import LaunchError

logger = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class JobOutcome:
    name: str
    phase: str
    reattached: bool
    log_tail: str


def job_phase(job: dict) -> str | None:
    """The newest condition that is true (Created, Running, Restarting, Succeeded, Failed), if any."""
    conditions = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return conditions[-1]["type"] if conditions else None


class KubernetesLauncher:
    """Runs PyTorchJobs through the Kubernetes API.

    Args:
        api_client: A configured `kubernetes.client.ApiClient`; None loads the in-cluster config
            (or `~/.kube/config` outside a cluster).
        watch_seconds: Longest single watch request; the launcher re-opens it until its deadline.
    """

    def __init__(self, api_client: Any = None, watch_seconds: int = 60) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.watch_seconds = watch_seconds

    def create(self, manifest: dict) -> tuple[dict, bool]:
        """Create the job, or return the existing one of the same name. Returns (job, re-attached)."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest), False
        except ApiException as err:
            if err.status != 409:
                raise LaunchError(f"cannot create PyTorchJob {namespace}/{name}: {err.status} {err.reason}: "
                                  f"{err.body}") from err
        logger.info("PyTorchJob %s/%s exists already (a retried task): re-attaching", namespace, name)
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name), True

    def wait(self, namespace: str, name: str, timeout: float, on_phase: Callable[[str], None] | None = None) -> str:
        """Watch the job until Succeeded or Failed; LaunchError after `timeout` seconds."""
        from kubernetes import watch

        deadline = time.monotonic() + timeout
        phase = job_phase(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        while phase not in TERMINAL:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError(f"PyTorchJob {namespace}/{name} did not finish within {timeout:g} s "
                                  f"(last condition: {phase})")
            stream = watch.Watch().stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                                          PLURAL, field_selector=f"metadata.name={name}",
                                          timeout_seconds=max(1, int(min(remaining, self.watch_seconds))))
            for event in stream:
                new_phase = job_phase(event["object"])
                if new_phase != phase and new_phase is not None:
                    phase = new_phase
                    logger.info("PyTorchJob %s/%s: %s", namespace, name, phase)
                    if on_phase:
                        on_phase(phase)
                if phase in TERMINAL:
                    break
        return phase

    def master_log_tail(self, namespace: str, name: str, lines: int = 60) -> str:
        """The last lines of the master pod's `pytorch` container; a note instead if it cannot be read."""
        from kubernetes.client.exceptions import ApiException

        selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/replica-type=master"
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
            if not pods:
                return "(no master pod found)"
            return self.core.read_namespaced_pod_log(pods[0].metadata.name, namespace, container="pytorch",
                                                     tail_lines=lines)
        except ApiException as err:
            return f"(master log unavailable: {err.status} {err.reason})"

    def delete(self, namespace: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as err:
            if err.status != 404:
                logger.warning("could not delete PyTorchJob %s/%s: %s %s", namespace, name, err.status, err.reason)

    def delete_run_jobs(self, namespace: str, run_label: str) -> list[str]:
        """Delete every PyTorchJob labelled `alignflow/run=<run_label>` (the exit handler's cleanup)."""
        jobs = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                         label_selector=f"alignflow/run={run_label}")
        names = [job["metadata"]["name"] for job in jobs.get("items", [])]
        for name in names:
            self.delete(namespace, name)
        return names

    def run(self, manifest: dict, timeout: float, keep_job: bool = False) -> JobOutcome:
        """Create (or re-attach), wait, and clean up. Raises LaunchError when the job fails or times out."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        _, reattached = self.create(manifest)
        try:
            phase = self.wait(namespace, name, timeout)
            tail = self.master_log_tail(namespace, name)
            if phase == "Failed":
                raise LaunchError(f"PyTorchJob {namespace}/{name} failed; last lines of its master:\n{tail}")
            return JobOutcome(name, phase, reattached, tail)
        finally:
            if not keep_job:
                self.delete(namespace, name)
