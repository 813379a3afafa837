"""Which kind of job a stage runs as: the platform's setting, checked against what the cluster serves.

`ALIGNFLOW_JOB_KIND` (the chart's `trainer.jobKind`) is one of:

- `trainjob`: Kubeflow Trainer v2. The API server must serve `trainer.kubeflow.org/v1alpha1`
  trainjobs and the runtime `ALIGNFLOW_TRAINER_RUNTIME` must exist (a TrainingRuntime in the
  namespace, or a ClusterTrainingRuntime).
- `pytorchjob`: the Training Operator v1. The API server must serve `kubeflow.org/v1` pytorchjobs.
- `auto` (the default): TrainJob when the API serves trainjobs and the runtime exists, else
  PyTorchJob when it serves pytorchjobs.

Either way the component's log says which kind was chosen and why, and a kind the cluster does not
serve is one error naming the missing API (or runtime), before anything is created. What the API
serves is read from its discovery endpoint (`/apis/<group>/<version>`), which every authenticated
account may read; the runtime is resolved through the Kubeflow SDK (`TrainJobKind.resolve_runtime`).
"""

from __future__ import annotations

import logging
from typing import Any

from components.launcher.kinds.interface import JobKind
from components.launcher.kinds.pytorchjob import api as pytorchjob_api
from components.launcher.kinds.trainjob import api as trainjob_api
from components.launcher.settings.scheduling import check_job_kind
from components.launcher.shared.retry import RetryPolicy
from trainer.errors import LaunchError
from trainer.http.transient import describe

logger = logging.getLogger(__name__)



def api_text(api: tuple[str, str, str]) -> str:
    group, version, plural = api
    return f"{group}/{version} {plural}"


def serves(api_client: Any, api: tuple[str, str, str], retry: RetryPolicy) -> bool:
    """Whether the API server serves `api` (group, version, plural), from its discovery document."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    group, version, plural = api
    try:
        listing = retry.call(client.CustomObjectsApi(api_client).get_api_resources, f"discover {group}/{version}",
                             group, version)
    except ApiException as err:
        if err.status == 404:
            return False
        raise LaunchError(f"cannot tell whether the API server serves {api_text(api)}: {describe(err)}") from err
    return any(resource.name == plural for resource in listing.resources or [])


def _trainjob_kind(api_client: Any, namespace: str, runtime: str) -> JobKind:
    from components.launcher.kinds.trainjob.kind import TrainJobKind

    return TrainJobKind(api_client, namespace, runtime)


def _pytorchjob_kind(api_client: Any) -> JobKind:
    from components.launcher.kinds.pytorchjob.kind import PyTorchJobKind

    return PyTorchJobKind(api_client)


def choose_job_kind(api_client: Any, namespace: str, setting: str, runtime: str,
                    retry: RetryPolicy | None = None) -> JobKind:
    """The job kind for a stage, per `setting` and what the cluster serves; its choice and reason are logged.

    Raises:
        LaunchError: The setting's kind (or, with `auto`, either kind) cannot run on this cluster, naming the
            missing API or runtime.
    """
    from components.launcher.kinds.trainjob.kind import RuntimeNotFound

    setting, retry = check_job_kind(setting), retry or RetryPolicy()
    if setting == "pytorchjob":
        if not serves(api_client, pytorchjob_api.API, retry):
            raise LaunchError(f"job kind pytorchjob (ALIGNFLOW_JOB_KIND): the API server does not serve "
                              f"{api_text(pytorchjob_api.API)} ({pytorchjob_api.INSTALL_HINT})")
        logger.info("job kind: PyTorchJob (ALIGNFLOW_JOB_KIND=pytorchjob)")
        return _pytorchjob_kind(api_client)
    why_not = f"the API server does not serve {api_text(trainjob_api.API)}"
    if serves(api_client, trainjob_api.API, retry):
        kind = _trainjob_kind(api_client, namespace, runtime)
        try:
            kind.resolve_runtime(retry)
            if setting == "trainjob":
                logger.info("job kind: TrainJob (ALIGNFLOW_JOB_KIND=trainjob), runtime %s", runtime)
            else:
                logger.info("job kind: TrainJob (ALIGNFLOW_JOB_KIND=auto: the API server serves %s and runtime %s "
                            "exists)", api_text(trainjob_api.API), runtime)
            return kind
        except RuntimeNotFound as err:
            if setting == "trainjob":
                raise LaunchError(f"job kind trainjob (ALIGNFLOW_JOB_KIND): {err}") from err
            why_not = str(err)
    elif setting == "trainjob":
        raise LaunchError(f"job kind trainjob (ALIGNFLOW_JOB_KIND): {why_not} ({trainjob_api.INSTALL_HINT})")
    if not serves(api_client, pytorchjob_api.API, retry):
        raise LaunchError(f"job kind auto (ALIGNFLOW_JOB_KIND): no kind of training job can run here: {why_not}, "
                          f"and the API server does not serve {api_text(pytorchjob_api.API)} (install Kubeflow Trainer "
                          "v2 and its runtime, or the Training Operator v1)")
    logger.info("job kind: PyTorchJob (ALIGNFLOW_JOB_KIND=auto: %s; the API server serves %s)", why_not,
                api_text(pytorchjob_api.API))
    return _pytorchjob_kind(api_client)


def cleanup_kinds(api_client: Any, namespace: str, setting: str, retry: RetryPolicy | None = None) -> list[JobKind]:
    """The kinds whose jobs a run may have left: the setting's, or with `auto` every kind the API serves."""
    setting, retry = check_job_kind(setting), retry or RetryPolicy()
    kinds = []
    if setting in ("auto", "trainjob") and (setting == "trainjob" or serves(api_client, trainjob_api.API, retry)):
        kinds.append(_trainjob_kind(api_client, namespace, ""))
    if setting in ("auto", "pytorchjob") and (setting == "pytorchjob" or serves(api_client, pytorchjob_api.API, retry)):
        kinds.append(_pytorchjob_kind(api_client))
    return kinds
