"""What every stage component does: write the stage config, launch its job, read its results.

The job is a PyTorchJob or a TrainJob on Kubernetes (`kinds/choice.py` picks the kind), or the
PyTorchJob manifest run as local processes (`local/runner.py`).

A component passes its KFP inputs as URIs. The job's checkpoints and logs live under `job_root`
(keyed by pipeline run and task, so a retried task resumes from its checkpoint), and its final
HF model is written straight to the component's output Model URI (`export_dir`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field, make_dataclass, replace

import yaml

from components.launcher.kinds.pytorchjob.manifest import build_pytorchjob
from components.launcher.pod.spec import JobSpec, SecretEnv, derive_job_name
from components.launcher.settings.options import POD_OPTIONS, cluster_fields
from components.launcher.settings.platform import check_allowed
from trainer.errors import ConfigError, LaunchError
from trainer.secret_keys import MLFLOW_SECRET_KEYS, S3_SECRET_KEYS
from trainer.storage import get_storage, join_uri

logger = logging.getLogger(__name__)


def run_label(run_id: str) -> str:
    """The `alignflow/run` label value of a run's jobs (a valid label value, at most 63 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:63].strip("-_.") or "run"


@dataclass(kw_only=True, slots=True)
class LaunchFields:
    """How a stage's job is launched besides the pod options (`settings/options.py`); `ClusterOptions` adds those."""

    mode: str = "local"
    """`local` (processes on this machine) or `kubernetes` (a PyTorchJob or a TrainJob)."""
    image: str = "alignflow-trainer:latest"
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment of the job (never credentials)."""
    allowed_images: list[str] | None = None
    """Trainer images or prefixes the platform allows (see settings/platform.py); None: any."""
    allowed_secrets: list[str] | None = None
    """S3 Secrets the platform allows; None: any."""


# Where and how a stage's job runs: `LaunchFields` and every pod option (settings/options.py). The options that
# the job's spec carries pass straight to it (`stage_spec`).
ClusterOptions = make_dataclass("ClusterOptions", cluster_fields(), bases=(LaunchFields,), kw_only=True, slots=True,
                                namespace={"__module__": __name__, "__doc__": "Where and how a stage's job runs: "
                                           "`LaunchFields` and the pod options (settings/options.py)."})


def _secret_env(cluster: ClusterOptions) -> list[SecretEnv]:
    secrets = []
    if cluster.s3_secret:
        secrets += [SecretEnv(key, cluster.s3_secret, key) for key in S3_SECRET_KEYS]
    if cluster.mlflow_secret:
        secrets += [SecretEnv(key, cluster.mlflow_secret, key, optional=True) for key in MLFLOW_SECRET_KEYS]
    return secrets


# Seconds the pods get beyond the stage's `checkpoint.preemption_grace_seconds`. That grace already
# covers finishing the step and the blocking save and upload: the trainer's watchdog exits at its
# end. What comes after must still fit before the kubelet's SIGKILL: the workers' exit (CUDA and
# NCCL teardown, flushing logs, a few seconds on a GPU node), torchrun's agent seeing them go and
# exiting itself, and the signal reaching the workers a moment after the container's first process.
PREEMPTION_MARGIN_SECONDS = 10


def termination_grace_seconds(config: dict, cluster: ClusterOptions) -> int:
    """The pods' `terminationGracePeriodSeconds` for a stage config.

    The stage's `checkpoint.preemption_grace_seconds` (its default when unset) plus
    PREEMPTION_MARGIN_SECONDS, rounded up; never below `cluster.termination_grace_period_seconds`.
    The default config gives the default: 20 + 10 = 30 s, Kubernetes' own.

    Raises:
        ConfigError: The config's value is not a number of seconds > 0.
    """
    from trainer.config import CheckpointConfig  # pydantic: only when a manifest is built

    section = config.get("checkpoint") or {}
    grace = section.get("preemption_grace_seconds", CheckpointConfig.model_fields["preemption_grace_seconds"].default)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace > 0:
        raise ConfigError(f"checkpoint.preemption_grace_seconds is {grace!r}, expected a number of seconds > 0")
    return max(cluster.termination_grace_period_seconds, math.ceil(grace) + PREEMPTION_MARGIN_SECONDS)


def stage_spec(stage: str, config_uri: str, run_id: str, task: str, cluster: ClusterOptions, *,
               config: dict | None = None, initializer: dict | None = None) -> JobSpec:
    """What decides a stage's job, whatever its kind; `config` (the stage config) sets the pods' grace period, and
    `initializer` is a TrainJob's `spec.initializer` (`stage_initializers`)."""
    shared = {option.name: getattr(cluster, option.name) for option in POD_OPTIONS if option.in_job_spec}
    shared["termination_grace_period_seconds"] = termination_grace_seconds(config or {}, cluster)
    return JobSpec(**shared, name=derive_job_name(run_id, task), stage=stage, config_uri=config_uri, image=cluster.image,
                   secret_env=_secret_env(cluster), env={"ALIGNFLOW_PIPELINE_RUN_ID": run_id, **cluster.env},
                   labels={"alignflow/run": run_label(run_id)}, initializer=initializer)


def stage_initializers(config: dict, cluster: ClusterOptions, job_kind: str) -> tuple[dict, dict | None]:
    """The stage config the job reads, and its TrainJob's `spec.initializer` (None: the trainer reads s3:// itself).

    With `cluster.initializers` (ALIGNFLOW_INITIALIZERS) and a TrainJob, `model.path` and `data.*` are fetched once
    by Kubeflow Trainer's initializers and the config names their copies (kinds/trainjob/initializers.py); otherwise
    the config is returned as it is.

    Args:
        config: The stage config; it is not changed.
        cluster: Where the job runs (its `initializers` setting, and the S3 endpoint and region of its `env`).
        job_kind: `TrainJob`, `PyTorchJob`, or `local` (processes on this machine).

    Raises:
        ConfigError: An hf:// value the job cannot honour, naming its key.
    """
    from components.launcher.kinds.trainjob.initializers import hf_problems, plan_initializers

    fetched = bool(cluster.initializers) and job_kind == "TrainJob"
    why_not = ("local mode runs no initializers" if job_kind == "local" else
               "ALIGNFLOW_INITIALIZERS is off" if not cluster.initializers else f"a {job_kind} runs no initializers")
    problems = hf_problems(config, model_fetched=fetched, why_not=why_not)
    if problems:
        raise ConfigError("; ".join(problems))
    if not fetched:
        return config, None
    s3_env = {"ENDPOINT": cluster.env.get("AWS_ENDPOINT_URL", ""), "REGION": cluster.env.get("AWS_DEFAULT_REGION", "")}
    return plan_initializers(config, is_file=lambda uri: get_storage(uri).exists(uri), s3_env=s3_env)


def run_stage_job(stage: str, config: dict, *, model_uri: str | None, job_root: str, run_id: str, task: str,
                  cluster: ClusterOptions) -> dict[str, float]:
    """Launch `python -m trainer <stage>` as a job and return its final metrics.

    The platform's allow-lists, the job's values and (on Kubernetes) the job kind the cluster serves
    are checked first, in both modes, before anything is written.
    """
    if cluster.mode not in ("local", "kubernetes"):
        raise LaunchError(f"launcher_mode is {cluster.mode!r}, expected 'local' or 'kubernetes'")
    check_allowed(cluster.image, cluster.s3_secret, cluster.allowed_images, cluster.allowed_secrets)
    job_root = job_root.rstrip("/")
    # A training stage exports its model to the component's output Model; `evaluate` exports nothing.
    config = {**config, "output_dir": job_root} | ({"export_dir": model_uri} if model_uri else {})
    config_uri = join_uri(job_root, f"{stage}.yaml")
    spec = stage_spec(stage, config_uri, run_id, task, cluster, config=config)
    storage = get_storage(job_root)
    if cluster.mode == "local":
        from components.launcher.local.runner import run_local

        stage_initializers(config, cluster, "local")  # refuses what only initializers could read
        manifest = build_pytorchjob(spec)
        storage.write_bytes(config_uri, yaml.safe_dump(config, sort_keys=False).encode())
        run_local(manifest, timeout=cluster.timeout_seconds, log=print)
    else:
        from components.launcher.follow.launcher import KubernetesLauncher, load_api_client
        from components.launcher.kinds.choice import choose_job_kind

        api_client = load_api_client()
        kind = choose_job_kind(api_client, spec.namespace, cluster.job_kind, cluster.trainer_runtime)
        launcher = KubernetesLauncher(api_client, kind=kind, poll_seconds=cluster.poll_seconds,
                                      pending_timeout_seconds=cluster.pending_timeout_seconds)
        config, initializer = stage_initializers(config, cluster, kind.kind)
        if initializer:
            logger.info("Kubeflow Trainer's initializers fetch %s into /workspace",
                        ", ".join(f"{step} {entry['storageUri']}" for step, entry in initializer.items()))
            spec = replace(spec, initializer=initializer)
        request = kind.build(spec)
        storage.write_bytes(config_uri, yaml.safe_dump(config, sort_keys=False).encode())
        launcher.run(request, timeout=cluster.timeout_seconds)
    return json.loads(storage.read_bytes(join_uri(job_root, "final_metrics.json")))
