"""The TrainJob kind (`trainer.kubeflow.org/v1alpha1`, Kubeflow Trainer v2) behind the launcher's `JobKind`.

The Kubeflow SDK (`kubeflow.trainer.TrainerClient`, Kubernetes backend) does the work it can:
`get_runtime` resolves the runtime (the namespace's TrainingRuntime, else the ClusterTrainingRuntime
of that name), `train` creates the TrainJob (`request.py` builds its trainer, options and initializer),
`get_job_logs` gives the trainer's last lines for a failed task, and `delete_job` deletes it.

What the SDK cannot do, done here (each with the Kubernetes client the SDK itself uses):
- Retrying transient API failures: the SDK wraps every failure in a RuntimeError or TimeoutError;
  the Kubernetes error underneath is found (`api_failure`), and 5xx, 429 and dropped connections are
  retried with the launcher's backoff, never deleting the job.
- Re-attaching: a 409 from `train` means a retried task finds the job its first attempt created.
- Following the job: one GET of the TrainJob per poll (`follow.py`: its phase, why it failed or
  waits in a Kueue queue, its progress), where the SDK's `get_job` costs three calls and says less.
- A run's TrainJobs for the exit handler: `list_jobs` cannot select by label.
- Following the log as it grows, and why a pod is Pending (`follow/pods.py`): `get_job_logs` re-reads the
  whole log each time and the SDK says nothing about scheduling.

Pods are JobSet's (`jobset.sigs.k8s.io/jobset-name=<job>`); the trainer's log is container `node`
of the pod with completion index 0 (after a JobSet restart, the newest one).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from components.launcher.kinds.interface import JobDeleted, JobFollower, JobKind
from components.launcher.kinds.trainjob.api import GROUP, KIND, PLURAL, VERSION
from components.launcher.kinds.trainjob.request import NODE, TrainJobRequest, build_trainjob_request
from components.launcher.shared.retry import RetryPolicy
from trainer.errors import LaunchError
from trainer.http.transient import describe, is_transient

logger = logging.getLogger(__name__)
T = TypeVar("T")

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


class RuntimeNotFound(LaunchError):
    """The configured TrainingRuntime / ClusterTrainingRuntime does not exist."""


def api_failure(err: BaseException) -> BaseException | None:
    """The Kubernetes API failure the SDK wrapped (an ApiException, or the connection's error), if any."""
    from kubernetes.client.exceptions import ApiException

    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ApiException) or (seen is not err and is_transient(seen)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return err if isinstance(err, TimeoutError) else None


def status_of(err: BaseException) -> int | None:
    failure = api_failure(err)
    return getattr(failure, "status", None) if failure is not None else None


@contextlib.contextmanager
def _quiet_version_probe() -> Iterator[None]:
    """While the SDK's client starts, hold back its warning that Kubeflow Trainer's version ConfigMap in
    `kubeflow-system` is unreadable: a stage's pod has no business there, and the warning (a whole HTTP
    response) would open every stage's log. The SDK never acts on that version."""
    sdk_logger = logging.getLogger("kubeflow.trainer.backends.kubernetes.backend")
    level = sdk_logger.level
    sdk_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        sdk_logger.setLevel(level)


class TrainJobKind(JobKind):
    """TrainJobs through the Kubeflow SDK (see the module docstring).

    Args:
        api_client: A configured `kubernetes.client.ApiClient` (the SDK gets its configuration).
        namespace: Where the jobs run (the SDK's client is bound to one namespace).
        runtime: Name of the TrainingRuntime or ClusterTrainingRuntime the jobs reference.
    """

    kind = KIND
    container = NODE

    def __init__(self, api_client: Any, namespace: str, runtime: str = "") -> None:
        from kubeflow.common.types import KubernetesBackendConfig
        from kubeflow.trainer import TrainerClient
        from kubernetes import client

        with _quiet_version_probe():
            self.client = TrainerClient(KubernetesBackendConfig(namespace=namespace,
                                                                client_configuration=api_client.configuration))
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.runtime_name = runtime
        self.runtime: Any = None

    # ---- the SDK's calls, with the launcher's retries

    def sdk(self, function: Callable[..., T], what: str, retry: RetryPolicy, *args: Any,
            on_not_found: Callable[[], None] | None = None, **kwargs: Any) -> T:
        """`function(*args, **kwargs)` (an SDK call), retried through transient API failures.

        Raises:
            LaunchError: Any other failure, naming `what` and the API's answer (`on_not_found` runs first
                on a 404, to raise something more precise).
        """
        while True:
            try:
                result = function(*args, **kwargs)
            except (RuntimeError, TimeoutError, ValueError) as err:
                failure = api_failure(err)
                if failure is not None and is_transient(failure):
                    retry.failed(failure, what)
                    continue
                if status_of(err) == 404 and on_not_found is not None:
                    on_not_found()
                detail = f": {describe(failure)}" if failure is not None else ""
                raise LaunchError(f"{what} through the Kubeflow SDK failed: {err}{detail}") from err
            retry.succeeded()
            return result

    def resolve_runtime(self, retry: RetryPolicy) -> Any:
        """The runtime the jobs reference (SDK `get_runtime`); RuntimeNotFound when it does not exist."""
        def not_found() -> None:
            raise RuntimeNotFound(f"runtime {self.runtime_name!r} exists neither as a TrainingRuntime in namespace "
                                  f"{self.namespace} nor as a ClusterTrainingRuntime (ALIGNFLOW_TRAINER_RUNTIME; the "
                                  "chart installs one with training.runtime.create)")

        if self.runtime is None:
            try:
                self.runtime = self.sdk(self.client.get_runtime, f"get runtime {self.runtime_name}", retry,
                                        self.runtime_name, on_not_found=not_found)
            except LaunchError as err:
                if status_of(err.__cause__ or err) != 403 or isinstance(err, RuntimeNotFound):
                    raise
                # The namespace has no TrainingRuntime of that name, and this account may not look for a
                # ClusterTrainingRuntime (the chart grants that only with training.runtime.kind=ClusterTrainingRuntime).
                raise RuntimeNotFound(f"runtime {self.runtime_name!r} is not a TrainingRuntime in namespace "
                                      f"{self.namespace}, and this account may not read ClusterTrainingRuntimes "
                                      "(403; the chart grants that with training.runtime.kind=ClusterTrainingRuntime)"
                                      ) from err
        return self.runtime

    def confirm_exists(self, name: str, retry: RetryPolicy) -> None:
        """JobDeleted if the TrainJob is gone (a 404 from `get_job` may also mean a missing runtime)."""
        from kubernetes.client.exceptions import ApiException

        try:
            retry.call(self.custom.get_namespaced_custom_object,
                       f"get TrainJob {name}", GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                raise JobDeleted(f"TrainJob {self.namespace}/{name} was deleted externally (not found); "
                                 "the task fails without waiting further") from err
            raise

    # ---- JobKind

    def build(self, spec) -> TrainJobRequest:
        return build_trainjob_request(spec)

    def identity(self, request: TrainJobRequest) -> tuple[str, str]:
        return request.namespace, request.name

    def create(self, request: TrainJobRequest, retry: RetryPolicy) -> bool:
        what = f"TrainJob {request.namespace}/{request.name}"
        runtime = self.resolve_runtime(retry)
        while True:
            try:
                self.client.train(runtime=runtime, initializer=request.initializer, trainer=request.trainer,
                                  options=request.options)
            except (RuntimeError, TimeoutError, ValueError) as err:
                failure = api_failure(err)
                if status_of(err) == 409:
                    logger.info("%s exists already (a retried task): re-attaching", what)
                    self.confirm_exists(request.name, retry)
                    return True
                if failure is not None and is_transient(failure):
                    retry.failed(failure, f"create {what}")
                    continue
                body = getattr(failure, "body", "") or ""
                answer = f"{failure.status} {failure.reason}: {body}" if hasattr(failure, "status") else str(err)
                raise LaunchError(f"cannot create {what}: {answer}") from err
            retry.succeeded()
            logger.info("%s created through the Kubeflow SDK (runtime %s %s)", what, runtime.kind.value, runtime.name)
            return False

    def follower(self, namespace: str, name: str, retry: RetryPolicy) -> JobFollower:
        from components.launcher.kinds.trainjob.follow import TrainJobReader

        return TrainJobReader(self.custom, namespace, name, retry)

    def pod_selector(self, name: str) -> str:
        return f"{JOBSET_NAME_LABEL}={name}"

    def rank_zero_pod(self, pods: list) -> str | None:
        """The started `node` pod of completion index 0; after a JobSet restart the newest attempt's."""
        def attempt(pod) -> tuple[int, float]:
            labels = pod.metadata.labels or {}
            created = pod.metadata.creation_timestamp
            return int(labels.get(RESTART_ATTEMPT_LABEL, "0") or 0), created.timestamp() if created else 0.0

        started = [pod for pod in pods if (pod.metadata.labels or {}).get(REPLICATED_JOB_LABEL) == NODE
                   and (pod.metadata.labels or {}).get(COMPLETION_INDEX_LABEL) == "0"
                   and pod.status is not None and pod.status.phase != "Pending"]
        return max(started, key=attempt).metadata.name if started else None

    def log_tail(self, namespace: str, name: str, lines: int) -> str:
        try:
            log = list(self.client.get_job_logs(name, step=f"{NODE}-0"))
        except (RuntimeError, TimeoutError) as err:
            failure = api_failure(err)
            return f"(trainer log unavailable: {describe(failure) if failure is not None else err})"
        return "\n".join(log[-lines:]) if log else "(no started node-0 pod found)"

    def delete(self, namespace: str, name: str) -> None:
        try:
            self.sdk(self.client.delete_job, f"delete TrainJob {name}", RetryPolicy(max_retries=3), name)
            logger.info("TrainJob %s/%s deleted", namespace, name)
        except LaunchError as err:
            if status_of(err.__cause__ or err) == 404:
                return
            logger.warning("could not delete TrainJob %s/%s: %s", namespace, name, err)

    def run_jobs(self, namespace: str, run_label: str, retry: RetryPolicy) -> list[str]:
        jobs = retry.call(self.custom.list_namespaced_custom_object, "list the run's TrainJobs", GROUP,
                          VERSION, namespace, PLURAL, label_selector=f"alignflow/run={run_label}")
        return [job["metadata"]["name"] for job in jobs.get("items", [])]
