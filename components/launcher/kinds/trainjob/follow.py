"""Following one TrainJob with one read of it per poll: its phase, why it failed or waits, and its progress.

The Kubeflow SDK's `get_job` costs three calls a poll (GET the TrainJob, GET its runtime, LIST its pods) and still
says nothing about why a job failed or waits. The TrainJob itself says all the launcher needs:
- `status.conditions`: Complete (Succeeded), Failed (with Trainer's reason and message), Suspended;
- `spec.suspend` with Kueue's queue label: the job waits for quota in that queue (Kueue suspends a job until its
  Workload is admitted); the reason is the Workload's (`kueue.x-k8s.io` Workload whose `job-uid` label is the
  TrainJob's uid, condition QuotaReserved=False: "couldn't assign flavors ... insufficient quota"), read once per
  change of the TrainJob and only where the account may (the chart grants it with `scheduling.kueueQueue`);
- `status.jobsStatus`: a ready trainer job (`node`) is Running; none ready after Running is a JobSet restart
  (the initializers' jobs come and go before it);
- `status.trainerStatus` (Trainer v2.2+, KEP-2779): the progress rank 0 reports, logged when it changes;
- `metadata.resourceVersion`: whether anything changed since the last poll, so the launcher lists pods only then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from components.launcher.kinds.interface import JobDeleted, JobFollower, JobState
from components.launcher.kinds.trainjob.api import GROUP, PLURAL, VERSION
from components.launcher.kinds.trainjob.request import NODE
from components.launcher.shared.retry import RetryPolicy

logger = logging.getLogger(__name__)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP, WORKLOADS = "kueue.x-k8s.io", "workloads"
# Workloads' API versions, newest first: v1beta2 is the storage version since Kueue 0.15, which deprecated v1beta1;
# older Kueues serve v1beta1 only.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def true_conditions(job: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def phase_of(job: dict, previous: str | None) -> tuple[str, str]:
    """(phase, message) of a TrainJob: Failed, Succeeded, Queued (Kueue), Suspended, Running, Restarting, Created."""
    conditions = true_conditions(job)
    if "Failed" in conditions:
        failed = conditions["Failed"]
        return "Failed", f"{failed.get('reason', '')}: {failed.get('message', '')}".strip(": ")
    if "Complete" in conditions:
        return "Succeeded", ""
    if (job.get("spec") or {}).get("suspend") or "Suspended" in conditions:
        queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if queue:
            return "Queued", f"queued by Kueue in queue {queue}, waiting for quota"
        return "Suspended", (conditions.get("Suspended") or {}).get("message", "")
    # Only the trainer's job counts: an initializer job that was ready and has completed is no restart.
    if any(status.get("ready") and status.get("name") == NODE for status in (job.get("status") or {}).get("jobsStatus")
           or []):
        return "Running", ""
    return ("Restarting" if previous in ("Running", "Restarting") else "Created"), ""


def progress_line(trainer_status: dict) -> str:
    """`42% (about 95 s left): loss=1.2, currentStep=40` from a TrainJob's `status.trainerStatus`."""
    head = f"{trainer_status['progressPercentage']}%" if "progressPercentage" in trainer_status else "progress"
    if "estimatedRemainingSeconds" in trainer_status:
        head += f" (about {trainer_status['estimatedRemainingSeconds']} s left)"
    metrics = ", ".join(f"{m['name']}={m['value']}" for m in trainer_status.get("metrics") or [])
    return f"{head}: {metrics}" if metrics else head


class TrainJobReader(JobFollower):
    """Reads the TrainJob once per `states` call (after the first, `seconds` later); see the module docstring.

    Args:
        custom: A `kubernetes.client.CustomObjectsApi`.
        namespace: The job's namespace.
        name: The job's name.
        retry: Backoff for transient API failures.
    """

    def __init__(self, custom: Any, namespace: str, name: str, retry: RetryPolicy) -> None:
        self.custom, self.namespace, self.name, self.retry = custom, namespace, name, retry
        self.phase: str | None = None
        self.resource_version = ""
        self.has_changed = True
        self.started = False
        self.progress = ""

    def read(self) -> dict:
        """The TrainJob (one GET); JobDeleted when it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.retry.call(self.custom.get_namespaced_custom_object, f"get TrainJob {self.name}", GROUP,
                                   VERSION, self.namespace, PLURAL, self.name)
        except ApiException as err:
            if err.status == 404:
                raise JobDeleted(f"TrainJob {self.namespace}/{self.name} was deleted externally (not found); "
                                 "the task fails without waiting further") from err
            raise

    def states(self, seconds: float) -> Iterator[JobState]:
        if self.started:
            time.sleep(seconds)
        self.started = True
        job = self.read()
        version = job["metadata"].get("resourceVersion", "")
        self.has_changed, self.resource_version = version != self.resource_version, version
        phase, message = phase_of(job, self.phase)
        if phase == "Queued" and self.has_changed:
            message = self.kueue_reason(job) or message
        self.phase = phase
        self._log_progress((job.get("status") or {}).get("trainerStatus"))
        yield JobState(phase, message)

    def kueue_reason(self, job: dict) -> str:
        """Why Kueue has not admitted the job (its Workload's QuotaReserved=False message), or "" when unreadable."""
        from kubernetes.client.exceptions import ApiException

        workloads: dict = {}
        for version in KUEUE_VERSIONS:
            try:
                workloads = self.custom.list_namespaced_custom_object(
                    KUEUE_GROUP, version, self.namespace, WORKLOADS,
                    label_selector=f"{JOB_UID_LABEL}={job['metadata'].get('uid', '')}")
                break
            except ApiException as err:
                if err.status != 404:  # this account may not read Workloads: the queue's name must do
                    return ""
        # Neither version served: no Kueue here, and `workloads` stays empty.
        for workload in workloads.get("items") or []:
            for condition in (workload.get("status") or {}).get("conditions") or []:
                if condition.get("type") == "QuotaReserved" and condition.get("status") == "False":
                    queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
                    return f"queued by Kueue in queue {queue}: {condition.get('message') or condition.get('reason')}"
        return ""

    def _log_progress(self, trainer_status: dict | None) -> None:
        if not trainer_status:
            return
        line = progress_line(trainer_status)
        if line != self.progress:
            self.progress = line
            logger.info("TrainJob %s/%s: %s", self.namespace, self.name, line)
