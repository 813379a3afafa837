"""The one place Kubernetes, resource, caching and retry options are applied to pipeline tasks.

Every task gets the platform's environment through `kfp.kubernetes`, so the compiled IR's
`platforms.kubernetes` section carries it and the component pods really get it:

- the chart's defaults ConfigMap (`ALIGNFLOW_DEFAULTS_CONFIGMAP`, default `alignflow-defaults`) as
  environment: MLflow URI, S3 endpoint and region, images, scheduling defaults (placement, pod
  resources, shm, deadline, pending limit), the S3 retry budget, allow-lists; the chart renders
  every key (a key missing from the ConfigMap would keep the pod from starting);
- the S3 credentials Secret (`ALIGNFLOW_S3_SECRET`) as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
  unless it is empty (instance roles, IRSA);
- the MLflow credentials Secret (`ALIGNFLOW_MLFLOW_SECRET`, optional keys) when one is named.

These names are read when the pipeline is compiled (the chart's upload Job compiles with its
values), not from pipeline parameters: which Secrets a run may mount is the platform's choice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kfp import dsl, kubernetes

from components.launcher.settings.options import option_variables
from trainer.allow_list import ALLOW_LIST_VARIABLES
from trainer.secret_keys import MLFLOW_SECRET_KEYS, S3_SECRET_KEYS

# ConfigMap keys are the environment variable names they become (the chart renders them so). The pod options'
# keys come from their one declaration (components/launcher/settings/options.py); these are the others.
PLATFORM_KEYS = (
    "ALIGNFLOW_TRAINER_IMAGE", "ALIGNFLOW_TRAINER_VLLM_IMAGE", "ALIGNFLOW_LAUNCHER_IMAGE", "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION", "MLFLOW_TRACKING_URI", "ALIGNFLOW_PIPELINE_ROOT", "ALIGNFLOW_MLFLOW_EXTERNAL_URL",
    "ALIGNFLOW_ALLOWED_IMAGES", "ALIGNFLOW_ALLOWED_SECRETS", *ALLOW_LIST_VARIABLES, "ALIGNFLOW_S3_RETRY_SECONDS",
)
DEFAULTS_KEYS = (*PLATFORM_KEYS, *option_variables())


@dataclass(frozen=True, slots=True)
class Platform:
    """What the platform team decided, read from the environment at compile time."""

    defaults_config_map: str = "alignflow-defaults"
    s3_secret: str = ""
    mlflow_secret: str = ""
    # Requests of a component pod: it only writes configs, watches a job and copies small files.
    resources: dict[str, str] = field(default_factory=lambda: {"cpu": "250m", "memory": "512Mi",
                                                               "memory_limit": "2Gi"})

    @classmethod
    def from_environment(cls) -> Platform:
        return cls(defaults_config_map=os.environ.get("ALIGNFLOW_DEFAULTS_CONFIGMAP", "alignflow-defaults"),
                   s3_secret=os.environ.get("ALIGNFLOW_S3_SECRET", ""),
                   mlflow_secret=os.environ.get("ALIGNFLOW_MLFLOW_SECRET", ""))


def apply_platform(task: dsl.PipelineTask, platform: Platform | None = None) -> dsl.PipelineTask:
    """Give a task's pod the platform's environment, Secrets and resource requests."""
    platform = platform or Platform.from_environment()
    kubernetes.use_config_map_as_env(task, platform.defaults_config_map, {key: key for key in DEFAULTS_KEYS})
    if platform.s3_secret:
        kubernetes.use_secret_as_env(task, platform.s3_secret, {key: key for key in S3_SECRET_KEYS})
    if platform.mlflow_secret:
        kubernetes.use_secret_as_env(task, platform.mlflow_secret, {key: key for key in MLFLOW_SECRET_KEYS},
                                     optional=True)
    task.set_cpu_request(platform.resources["cpu"])
    task.set_memory_request(platform.resources["memory"])
    task.set_memory_limit(platform.resources["memory_limit"])
    return task


def as_step(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """A light task (inputs, evaluation launcher, registration, cleanup): the platform's environment only."""
    return apply_platform(task)


def as_stage(task: dsl.PipelineTask, retries: int = 2) -> dsl.PipelineTask:
    """A training stage: never cached (it is keyed by the run), retried (a retry resumes from its checkpoint)."""
    apply_platform(task)
    task.set_caching_options(False)
    task.set_retry(num_retries=retries, backoff_duration="30s", backoff_factor=2.0)
    return task
