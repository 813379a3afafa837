"""Looking at a job's pods while it runs: why one is stuck Pending, and what the trainer prints.

- `PodMonitor` lists the job's pods (the kind's label selector) and the events
  of the Pending ones. A pod is stuck when the scheduler cannot place it (PodScheduled=False,
  reason Unschedulable: an untolerated taint, `Insufficient nvidia.com/gpu`, ...), when a
  container cannot start (ErrImagePull, ImagePullBackOff, InvalidImageName,
  CreateContainerConfigError such as a missing Secret, CreateContainerError), or when a Warning
  event names another reason (FailedMount, FailedCreatePodSandBox). Each new reason is logged as
  one line; a pod stuck for longer than the pending limit fails the task (`PodsStuckPending`).
  A pod that is merely slow (pulling a large image) is not stuck.
- `LogFollower` copies the rank-0 pod's trainer log (the kind's container: `pytorch` of a
  PyTorchJob, `node` of a TrainJob) into the component's log, each line
  prefixed with the pod's name. It polls with `sinceSeconds` and `timestamps=true` and drops
  lines it has already copied, so a line is copied once even though polls overlap.

Reading pods, events or logs is a courtesy: when the API refuses (RBAC) or fails, the launcher
says so once and goes on following the job.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from trainer.errors import LaunchError
from trainer.http.transient import describe, is_transient

logger = logging.getLogger(__name__)

STUCK_WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                         "CreateContainerError")
FIRST_LOG_LINES = 200  # on (re-)attaching, older lines are left in the pod
LOG_LIMIT_BYTES = 4 * 1024 * 1024
SINCE_SLACK_SECONDS = 5  # polls overlap by this much; copied lines are recognised by their timestamp
_BARE_ERROR = re.compile(r"^Error: \w+$")  # the kubelet's echo of a waiting reason
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$")


class PodsStuckPending(LaunchError):
    """A pod of the job stayed Pending for a known reason longer than the pending limit."""


@dataclass(frozen=True, slots=True)
class PendingReason:
    reason: str
    message: str


def pending_reason(pod) -> PendingReason | None:
    """Why a Pending pod cannot start, read from its status; None when its status names no reason."""
    status = pod.status
    if status is None or status.phase != "Pending":
        return None
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
            return PendingReason("Unschedulable", condition.message or "")
    for container in (status.init_container_statuses or []) + (status.container_statuses or []):
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in STUCK_WAITING_REASONS:
            return PendingReason(waiting.reason, waiting.message or "")
    return None


def _event_time(event) -> float:
    when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
    return when.timestamp() if when is not None else 0.0


class _Courtesy:
    """Calls whose failure is reported once and otherwise ignored."""

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def call(self, what: str, function, *args, quiet: tuple[int, ...] = (), **kwargs):
        """`function(*args, **kwargs)`, or None when the API fails; statuses in `quiet` are expected answers."""
        from kubernetes.client.exceptions import ApiException

        try:
            return function(*args, **kwargs)
        except Exception as err:
            if not (isinstance(err, ApiException) or is_transient(err)):
                raise
            if getattr(err, "status", None) in quiet:
                return None
            if what not in self.reported:
                self.reported.add(what)
                logger.warning("cannot %s (%s); going on without it", what, describe(err))
            return None


class PodMonitor:
    """Reports stuck Pending pods of one job, and fails the task when one stays stuck too long.

    Args:
        core: A `kubernetes.client.CoreV1Api`.
        namespace: The job's namespace.
        pending_timeout: Seconds a pod may stay stuck Pending.
        selector: The label selector of the job's pods (the job kind's).
        what: How messages name the job (`PyTorchJob ns/name`).
    """

    def __init__(self, core, namespace: str, pending_timeout: float, *, selector: str, what: str) -> None:
        self.core = core
        self.namespace = namespace
        self.pending_timeout = pending_timeout
        self.selector = selector
        self.what = what
        self.stuck_since: dict[str, float] = {}
        self.reported: dict[str, PendingReason] = {}
        self.courtesy = _Courtesy()

    def list_pods(self) -> list:
        listing = self.courtesy.call("list the job's pods", self.core.list_namespaced_pod, self.namespace,
                                     label_selector=self.selector)
        return listing.items if listing is not None else []

    def latest_warning(self, pod_name: str):
        """The pod's newest Warning event that says more than `Error: <reason>` (else the newest)."""
        listing = self.courtesy.call("list pod events", self.core.list_namespaced_event, self.namespace,
                                     field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}")
        warnings = [e for e in (listing.items if listing is not None else []) if e.type == "Warning"]
        ordered = [e for _, _, e in sorted((_event_time(e), i, e) for i, e in enumerate(warnings))]
        telling = [e for e in ordered if not _BARE_ERROR.match(e.message or "")]
        return (telling or ordered or [None])[-1]

    def check(self, pods: list) -> None:
        """Log each stuck pod's reason when it changes; PodsStuckPending past the pending limit."""
        now = time.monotonic()
        for pod in pods:
            name = pod.metadata.name
            reason = self._reason(pod)
            if reason is None:
                self.stuck_since.pop(name, None)
                self.reported.pop(name, None)
                continue
            since = self.stuck_since.setdefault(name, now)
            if self.reported.get(name) != reason:
                self.reported[name] = reason
                logger.warning("pod %s is Pending: %s: %s", name, reason.reason, reason.message)
            if now - since > self.pending_timeout:
                raise PodsStuckPending(
                    f"{self.what}: pod {name} stayed Pending for {now - since:.0f} s "
                    f"(pending limit {self.pending_timeout:g} s): {reason.reason}: {reason.message}")

    def _reason(self, pod) -> PendingReason | None:
        if pod.status is None or pod.status.phase != "Pending":
            return None
        reason = pending_reason(pod)
        event = self.latest_warning(pod.metadata.name)
        if reason is None and event is not None:
            return PendingReason(event.reason or "Warning", event.message or "")
        if reason is not None and event is not None and event.message and event.message not in reason.message:
            # The event often says more than the status (`Back-off pulling image` vs the registry's answer).
            return PendingReason(reason.reason, f"{reason.message} (event {event.reason}: {event.message})")
        return reason


def _timestamp_key(stamp: str) -> tuple[str, int] | None:
    """An RFC 3339 UTC timestamp as something ordered to the nanosecond (datetime stops at microseconds)."""
    match = _TIMESTAMP.match(stamp)
    if not match:
        return None
    return match.group(1), int((match.group(2) or "").ljust(9, "0"))


class LogFollower:
    """Copies new lines of one pod's trainer container log into the component's log, each once.

    Args:
        core: A `kubernetes.client.CoreV1Api`.
        namespace: The pods' namespace.
        container: The trainer's container (the job kind's).
    """

    def __init__(self, core, namespace: str, container: str = "pytorch") -> None:
        self.core = core
        self.namespace = namespace
        self.container = container
        self.pod: str | None = None
        self.last_stamp: tuple[str, int] | None = None
        self.last_read: float | None = None
        self.courtesy = _Courtesy()

    def follow(self, pod: str | None) -> None:
        """Copy what `pod` wrote since the last call (the last FIRST_LOG_LINES on the first)."""
        if pod is None:
            return
        if pod != self.pod:
            self.pod, self.last_stamp, self.last_read = pod, None, None
        options: dict = {"container": self.container, "timestamps": True, "limit_bytes": LOG_LIMIT_BYTES}
        if self.last_read is None:
            options["tail_lines"] = FIRST_LOG_LINES
        else:
            options["since_seconds"] = int(time.monotonic() - self.last_read) + SINCE_SLACK_SECONDS
        started = time.monotonic()
        # 400: the container has not started (or restarts); 404: the pod is gone.
        text = self.courtesy.call("read the trainer's log", self.core.read_namespaced_pod_log, pod, self.namespace,
                                  quiet=(400, 404), **options)
        if text is None:
            return
        self.last_read = started
        self._copy(pod, text)

    def _copy(self, pod: str, text: str) -> None:
        for line in text.splitlines():
            stamp, _, message = line.partition(" ")
            key = _timestamp_key(stamp)
            if key is None:
                message = line
            elif self.last_stamp is not None and key <= self.last_stamp:
                continue  # copied by the previous poll
            else:
                self.last_stamp = key
            logger.info("[%s] %s", pod, message)
