"""Following one PyTorchJob's conditions: list for a resourceVersion, then watch from it.

The pattern every Kubernetes controller uses. Each watch request lasts at most `seconds` (the
caller looks at pods and logs in between) and resumes from the last resourceVersion seen, so no
change is missed between requests. When the server has compacted that version away it answers
410 Gone: the watcher lists again and watches from the fresh version. Transient failures are
retried by the `RetryPolicy`; a DELETED event, or a list without the job, raises `JobDeleted`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from components.launcher.kinds.interface import JobDeleted
from components.launcher.kinds.pytorchjob.api import GROUP, PLURAL, VERSION
from components.launcher.shared.retry import RetryPolicy
from trainer.http.transient import is_transient

logger = logging.getLogger(__name__)



def job_phase(job: dict) -> str | None:
    """The newest condition that is true (Created, Running, Restarting, Suspended, Succeeded, Failed), if any."""
    conditions = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return conditions[-1]["type"] if conditions else None


class JobWatcher:
    """The latest state of one job, kept current by list + watch.

    Args:
        custom: A `kubernetes.client.CustomObjectsApi`.
        namespace: The job's namespace.
        name: The job's name.
        retry: Backoff for transient API failures (shared with the caller's other calls).
    """

    def __init__(self, custom, namespace: str, name: str, retry: RetryPolicy) -> None:
        self.custom = custom
        self.namespace = namespace
        self.name = name
        self.retry = retry
        self.resource_version: str | None = None
        self.job: dict | None = None

    def _deleted(self, how: str) -> JobDeleted:
        return JobDeleted(f"PyTorchJob {self.namespace}/{self.name} was deleted externally ({how}); "
                          "the task fails without waiting further")

    def relist(self) -> dict:
        """List the job (a fresh resourceVersion); JobDeleted if it no longer exists."""
        listing = self.retry.call(self.custom.list_namespaced_custom_object, f"list PyTorchJob {self.name}",
                                  GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}")
        if not listing.get("items"):
            raise self._deleted("not found when listed")
        self.resource_version = listing["metadata"]["resourceVersion"]
        self.job = listing["items"][0]
        return self.job

    def watch(self, seconds: float) -> Iterator[dict]:
        """Yield the job after each change, for one watch request of about `seconds` (at least 1)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        if self.resource_version is None:
            yield self.relist()
        stream = watch.Watch().stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
            field_selector=f"metadata.name={self.name}", resource_version=self.resource_version,
            timeout_seconds=max(1, int(seconds)),
            # A connection that goes silent past the server's own timeout is a failure, not a hang.
            _request_timeout=(10, max(1, int(seconds)) + 30))
        try:
            for event in stream:
                job = event["raw_object"]
                if event["type"] == "DELETED":
                    raise self._deleted("watch reported DELETED")
                self.resource_version = job["metadata"]["resourceVersion"]
                self.job = job
                yield job
        except ApiException as err:
            if err.status != 410:
                if not is_transient(err):
                    raise
                self.retry.failed(err, f"watch PyTorchJob {self.name}")
                return
            logger.info("watch of PyTorchJob %s/%s expired (410 Gone): listing it again", self.namespace, self.name)
            yield self.relist()
            return
        except Exception as err:
            if not is_transient(err):
                raise
            self.retry.failed(err, f"watch PyTorchJob {self.name}")
            return
        finally:
            stream.close()  # releases the connection when the caller stops early
        self.retry.succeeded()
