"""Kubernetes mode: create the PyTorchJob, follow it to its end, report, clean up.

- The job name is derived from the pipeline run and task (`derive_job_name`), so when KFP retries
  a task, `create` answers 409 and the launcher re-attaches to the job already running instead of
  starting a second one.
- Following: list + watch of the job (`job_watch.py`), one watch request per `poll_seconds`; in
  between, the job's pods are looked at (`pods.py`): a pod stuck Pending is reported with its
  reason, and the trainer's log is copied into the component's log.
- Transient API failures (5xx, 429, a reset connection, 410 Gone) are retried with exponential
  backoff (`api_retry.py`). They never delete the job: if the API stays away past the retry
  budget the task fails and leaves the job running, and a retry of the task re-attaches to it.
- The job is deleted only when it ends (Succeeded, or Failed: `LaunchError` with the tail of the
  trainer's log), at the launcher's own deadline, when a pod stays stuck Pending past the pending
  limit, or when the task is cancelled: KFP cancelling a run sends SIGTERM to the component, and
  the handler installed while waiting deletes the job before the process exits.
- A job deleted by someone else fails the task at once.

`kubernetes` is imported here and in the modules named above only.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from components.launcher.api_retry import RetryPolicy
from components.launcher.job_watch import GROUP, PLURAL, VERSION, JobDeleted, JobWatcher, job_phase
from components.launcher.pods import JOB_LABEL, LogFollower, PodMonitor, PodsStuckPending, rank_zero_pod
from trainer.errors import LaunchError

logger = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
__all__ = ["GROUP", "PLURAL", "VERSION", "JobOutcome", "KubernetesLauncher", "job_phase"]


class JobTimedOut(LaunchError):
    """The job did not finish before the launcher's deadline."""


class JobCancelled(LaunchError):
    """The component was told to stop (SIGTERM from KFP, or Ctrl-C)."""


# Outcomes after which the launcher deletes the job; any other failure leaves it to a retried task.
DELETES_JOB = (JobTimedOut, JobCancelled, PodsStuckPending)


@dataclass(slots=True)
class JobOutcome:
    name: str
    phase: str
    reattached: bool
    log_tail: str


@contextlib.contextmanager
def sigterm_cancels() -> Iterator[None]:
    """While inside, SIGTERM raises JobCancelled (once: a second signal does not interrupt the cleanup).

    Signal handlers can only be set from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def cancel(signum: int, frame: Any) -> None:
        if not received:
            received.append(signum)
            raise JobCancelled(f"received {signal.Signals(signum).name}: the run was cancelled")

    previous = signal.signal(signal.SIGTERM, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class KubernetesLauncher:
    """Runs PyTorchJobs through the Kubernetes API.

    Args:
        api_client: A configured `kubernetes.client.ApiClient`; None loads the in-cluster config
            (or `~/.kube/config` outside a cluster).
        poll_seconds: How often pods, events and the log are looked at; also the longest single
            watch request (the watch resumes from its resourceVersion after each).
        pending_timeout_seconds: How long a pod may stay stuck Pending before the task fails.
        retry: Backoff for transient API failures; None: 8 retries from 1 s up to 30 s apart.
    """

    def __init__(self, api_client: Any = None, *, poll_seconds: float = 10.0, pending_timeout_seconds: float = 900.0,
                 retry: RetryPolicy | None = None) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.poll_seconds = poll_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        self.retry = retry or RetryPolicy()

    def create(self, manifest: dict) -> tuple[dict, bool]:
        """Create the job, or return the existing one of the same name. Returns (job, re-attached)."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            job = self.retry.call(self.custom.create_namespaced_custom_object, f"create PyTorchJob {name}",
                                  GROUP, VERSION, namespace, PLURAL, manifest)
            logger.info("PyTorchJob %s/%s created", namespace, name)
            return job, False
        except ApiException as err:
            if err.status != 409:
                raise LaunchError(f"cannot create PyTorchJob {namespace}/{name}: {err.status} {err.reason}: "
                                  f"{err.body}") from err
        logger.info("PyTorchJob %s/%s exists already (a retried task): re-attaching", namespace, name)
        return self.retry.call(self.custom.get_namespaced_custom_object, f"get PyTorchJob {name}",
                               GROUP, VERSION, namespace, PLURAL, name), True

    def wait(self, namespace: str, name: str, timeout: float, on_phase: Callable[[str], None] | None = None) -> str:
        """Follow the job until Succeeded or Failed, reporting stuck pods and copying the trainer's log.

        Raises JobTimedOut after `timeout` seconds, PodsStuckPending, JobDeleted, or ApiUnavailable.
        """
        deadline = time.monotonic() + timeout
        watcher = JobWatcher(self.custom, namespace, name, self.retry)
        monitor = PodMonitor(self.core, namespace, name, self.pending_timeout_seconds)
        follower = LogFollower(self.core, namespace)
        phase = None
        while True:
            for job in watcher.watch(min(self.poll_seconds, max(1.0, deadline - time.monotonic()))):
                new_phase = job_phase(job)
                if new_phase is not None and new_phase != phase:
                    phase = new_phase
                    logger.info("PyTorchJob %s/%s: %s", namespace, name, phase)
                    if on_phase:
                        on_phase(phase)
                if phase in TERMINAL:
                    break
            pods = monitor.list_pods()
            follower.follow(rank_zero_pod(pods))  # after the end too: the last lines
            if phase in TERMINAL:
                return phase
            monitor.check(pods)
            if time.monotonic() >= deadline:
                raise JobTimedOut(f"PyTorchJob {namespace}/{name} did not finish within {timeout:g} s "
                                  f"(last condition: {phase})")

    def master_log_tail(self, namespace: str, name: str, lines: int = 60) -> str:
        """The last lines of the rank-0 pod's `pytorch` container; a note instead if it cannot be read."""
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items
            pod = rank_zero_pod(pods)
            if pod is None:
                return "(no started master or worker-0 pod found)"
            return self.core.read_namespaced_pod_log(pod, namespace, container="pytorch", tail_lines=lines).rstrip("\n")
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

    def delete_run_jobs(self, namespace: str, run_label: str) -> list[str]:
        """Delete every PyTorchJob labelled `alignflow/run=<run_label>` (the exit handler's cleanup)."""
        jobs = self.retry.call(self.custom.list_namespaced_custom_object, "list the run's PyTorchJobs", GROUP,
                               VERSION, namespace, PLURAL, label_selector=f"alignflow/run={run_label}")
        names = [job["metadata"]["name"] for job in jobs.get("items", [])]
        for name in names:
            self.delete(namespace, name)
        return names

    def run(self, manifest: dict, timeout: float, keep_job: bool = False) -> JobOutcome:
        """Create (or re-attach), follow to the end, clean up. Raises LaunchError when the job does not succeed.

        The job is deleted when it ends (unless `keep_job`), at the deadline, when a pod stays stuck
        Pending, and on cancellation; never because the API server failed for a while.
        """
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        reattached = None
        with sigterm_cancels():
            try:
                _, reattached = self.create(manifest)
                phase = self.wait(namespace, name, timeout)
                tail = self.master_log_tail(namespace, name)
            except KeyboardInterrupt as err:
                self.delete(namespace, name)
                raise JobCancelled(f"interrupted; PyTorchJob {namespace}/{name} deleted") from err
            except DELETES_JOB as err:
                logger.error("%s", err)
                self.delete(namespace, name)
                raise type(err)(f"{err}; PyTorchJob {namespace}/{name} deleted") from err
            except LaunchError as err:
                if reattached is not None and not isinstance(err, JobDeleted):
                    logger.error("%s; PyTorchJob %s/%s is left running (a retry of the task re-attaches to it)",
                                 err, namespace, name)
                raise
        if not keep_job:
            self.delete(namespace, name)
        if phase == "Failed":
            raise LaunchError(f"PyTorchJob {namespace}/{name} failed; last lines of its trainer:\n{tail}")
        return JobOutcome(name, phase, reattached, tail)
