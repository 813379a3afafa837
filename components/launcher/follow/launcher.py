"""Kubernetes mode: create a stage's job, follow it to its end, report, clean up.

The job is a PyTorchJob or a TrainJob (`kinds/interface.py`: one interface, one implementation per kind in
`kinds/pytorchjob/` and `kinds/trainjob/`; `kinds/choice.py` picks the kind the cluster serves). The launcher
itself is the same for both:

- The job name is derived from the pipeline run and task (`derive_job_name`), so when KFP retries
  a task, `create` finds the job of that name (409) and the launcher re-attaches to the job already
  running instead of starting a second one.
- Following: the kind's follower (a watch of the PyTorchJob; one GET of a TrainJob), about once per
  `poll_seconds`; in between, the job's pods are looked at (`pods.py`; for a TrainJob only when it
  changed or a pod is not running yet): a pod stuck Pending is reported with its reason, and the
  trainer's log is copied into the component's log.
- Transient API failures (5xx, 429, a reset connection, 410 Gone) are retried with exponential
  backoff (`shared/retry.py`). They never delete the job: if the API stays away past the retry
  budget the task fails and leaves the job running, and a retry of the task re-attaches to it.
- The job is deleted only when it ends (Succeeded, or Failed: `LaunchError` with the tail of the
  trainer's log), at the launcher's own deadline, when a pod stays stuck Pending past the pending
  limit, or when the task is cancelled: KFP cancelling a run sends SIGTERM to the component, and
  the handler installed while waiting deletes the job before the process exits.
- A job deleted by someone else fails the task at once.

`kubernetes` is imported here, in the kinds' modules and in the modules named above only.
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

from components.launcher.follow.pods import LogFollower, PodMonitor, PodsStuckPending
from components.launcher.kinds.interface import TERMINAL, JobDeleted, JobKind
from components.launcher.shared.retry import RetryPolicy
from trainer.errors import LaunchError

logger = logging.getLogger(__name__)

__all__ = ["JobOutcome", "KubernetesLauncher", "delete_run_jobs", "load_api_client"]


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


def load_api_client() -> Any:
    """A `kubernetes` ApiClient from the in-cluster config (or `~/.kube/config` outside a cluster)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class KubernetesLauncher:
    """Runs one kind of training job through the Kubernetes API.

    Args:
        api_client: A configured `kubernetes.client.ApiClient`; None loads the in-cluster config
            (or `~/.kube/config` outside a cluster).
        kind: The job kind (`job_kind.JobKind`); None: PyTorchJob.
        poll_seconds: How often pods, events and the log are looked at; also the longest single
            watch request (the watch resumes from its resourceVersion after each).
        pending_timeout_seconds: How long a pod may stay stuck Pending before the task fails.
        retry: Backoff for transient API failures; None: 8 retries from 1 s up to 30 s apart.
    """

    def __init__(self, api_client: Any = None, *, kind: JobKind | None = None, poll_seconds: float = 10.0,
                 pending_timeout_seconds: float = 900.0, retry: RetryPolicy | None = None) -> None:
        from kubernetes import client

        if api_client is None:
            api_client = load_api_client()
        if kind is None:
            from components.launcher.kinds.pytorchjob.kind import PyTorchJobKind

            kind = PyTorchJobKind(api_client)
        self.kind = kind
        self.core = client.CoreV1Api(api_client)
        self.poll_seconds = poll_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        self.retry = retry or RetryPolicy()
        self.failure_message = ""  # why the followed job failed, when its status says so

    def create(self, request: Any) -> bool:
        """Create the job, or re-attach to the existing one of the same name. Returns True when re-attached."""
        return self.kind.create(request, self.retry)

    def wait(self, namespace: str, name: str, timeout: float, on_phase: Callable[[str], None] | None = None) -> str:
        """Follow the job until Succeeded or Failed, reporting stuck pods and copying the trainer's log.

        Raises JobTimedOut after `timeout` seconds, PodsStuckPending, JobDeleted, or ApiUnavailable.
        """
        what = f"{self.kind.kind} {namespace}/{name}"
        deadline = time.monotonic() + timeout
        follower = self.kind.follower(namespace, name, self.retry)
        monitor = PodMonitor(self.core, namespace, self.pending_timeout_seconds,
                             selector=self.kind.pod_selector(name), what=what)
        logs = LogFollower(self.core, namespace, container=self.kind.container)
        phase, pods, rank_zero = None, [], None
        while True:
            for state in follower.states(min(self.poll_seconds, max(1.0, deadline - time.monotonic()))):
                if state.phase is not None and state.phase != phase:
                    phase = state.phase
                    logger.info("%s: %s%s", what, phase, f" ({state.message})" if state.message else "")
                    if on_phase:
                        on_phase(phase)
                if phase in TERMINAL:
                    self.failure_message = state.message
                    break
            if needs_pod_listing(follower, pods, rank_zero, phase):
                pods = monitor.list_pods()
                rank_zero = self.kind.rank_zero_pod(pods)
            logs.follow(rank_zero)  # after the end too: the last lines
            if phase in TERMINAL:
                return phase
            monitor.check(pods)
            if time.monotonic() >= deadline:
                raise JobTimedOut(f"{what} did not finish within {timeout:g} s (last condition: {phase})")

    def master_log_tail(self, namespace: str, name: str, lines: int = 60) -> str:
        """The last lines of the rank-0 trainer's log; a note instead if it cannot be read."""
        return self.kind.log_tail(namespace, name, lines)

    def delete(self, namespace: str, name: str) -> None:
        self.kind.delete(namespace, name)

    def delete_run_jobs(self, namespace: str, run_label: str) -> list[str]:
        """Delete every job of this kind labelled `alignflow/run=<run_label>` (the exit handler's cleanup)."""
        names = self.kind.run_jobs(namespace, run_label, self.retry)
        for name in names:
            self.delete(namespace, name)
        return names

    def run(self, request: Any, timeout: float, keep_job: bool = False) -> JobOutcome:
        """Create (or re-attach), follow to the end, clean up. Raises LaunchError when the job does not succeed.

        `request` is what the kind's `build` returned (a PyTorchJob manifest, a TrainJob request). The
        job is deleted when it ends (unless `keep_job`), at the deadline, when a pod stays stuck
        Pending, and on cancellation; never because the API server failed for a while.
        """
        namespace, name = self.kind.identity(request)
        what = f"{self.kind.kind} {namespace}/{name}"
        reattached = None
        with sigterm_cancels():
            try:
                reattached = self.create(request)
                phase = self.wait(namespace, name, timeout)
                tail = self.master_log_tail(namespace, name)
            except KeyboardInterrupt as err:
                self.delete(namespace, name)
                raise JobCancelled(f"interrupted; {what} deleted") from err
            except DELETES_JOB as err:
                logger.error("%s", err)
                self.delete(namespace, name)
                raise type(err)(f"{err}; {what} deleted") from err
            except LaunchError as err:
                if reattached is not None and not isinstance(err, JobDeleted):
                    logger.error("%s; %s is left running (a retry of the task re-attaches to it)", err, what)
                raise
        if not keep_job:
            self.delete(namespace, name)
        if phase == "Failed":
            reason = f" ({self.failure_message})" if self.failure_message else ""
            raise LaunchError(f"{what} failed{reason}; last lines of its trainer:\n{tail}")
        return JobOutcome(name, phase, reattached, tail)


def needs_pod_listing(follower: Any, pods: list, rank_zero: str | None, phase: str | None) -> bool:
    """Whether to list the job's pods now: a follower that cannot tell a change (`has_changed`) always; else when
    the job changed, no trainer pod is known yet, a pod was not running (stuck Pending is checked), or it ended."""
    if getattr(follower, "has_changed", True) or rank_zero is None or phase in TERMINAL:
        return True
    return any(pod.status is None or pod.status.phase != "Running" for pod in pods)


def delete_run_jobs(namespace: str, run_label: str, job_kind: str = "auto") -> list[str]:
    """The exit handler's cleanup: delete a run's jobs (`alignflow/run=<run_label>`) of every kind it may have
    used (`job_kind`: the platform's setting; `auto` looks at every kind the API serves). Returns `Kind/name`s."""
    from components.launcher.kinds.choice import cleanup_kinds

    api_client = load_api_client()
    deleted = []
    for kind in cleanup_kinds(api_client, namespace, job_kind):
        launcher = KubernetesLauncher(api_client, kind=kind)
        deleted += [f"{kind.kind}/{name}" for name in launcher.delete_run_jobs(namespace, run_label)]
    return deleted
