"""Everything that decides one stage's job, whatever its kind: `JobSpec`, its Secrets, its name and labels.

The PyTorchJob manifest (`kinds/pytorchjob/manifest.py`) and the TrainJob request
(`kinds/trainjob/request.py`) are both built from a `JobSpec`; the pod they share is `template.py`'s,
and the checks of its values are `checks.py`'s. This module imports neither. The pod options themselves
(resources, placement, counts) are declared once in `settings/options.py`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, make_dataclass

from components.launcher.settings.options import job_spec_fields

# The trainer's sub-commands a job may run: the training stages and the evaluation of a model.
STAGES = ("sft", "rm", "dpo", "kto", "orpo", "ppo", "grpo", "evaluate")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(slots=True)
class SecretEnv:
    """An environment variable read from a key of an existing Kubernetes Secret."""

    name: str
    secret: str
    key: str
    optional: bool = False
    """When true, a missing Secret or key leaves the variable unset instead of blocking the pod."""


@dataclass(kw_only=True, slots=True)
class JobFields:
    """What decides a stage's job besides the pod options (`settings/options.py`); `JobSpec` adds those.

    The fields marked "PyTorchJob only" are a TrainJob runtime's business (the chart's TrainingRuntime).
    """

    name: str
    """Job name: a DNS-1035 label of at most 63 characters (see `derive_job_name`)."""
    stage: str
    """One of STAGES: the trainer's sub-command."""
    config_uri: str
    """Where the job reads its stage config (s3:// or a local path)."""
    image: str
    """The trainer image."""
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment values; never credentials (rejected when a URL carries a password)."""
    secret_env: list[SecretEnv] = field(default_factory=list)
    restart_policy: str = "OnFailure"
    """PyTorchJob only."""
    ttl_seconds_after_finished: int | None = 3600
    """PyTorchJob only."""
    clean_pod_policy: str = "None"
    """PyTorchJob only."""
    extra_args: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """Labels of the job and of its pods."""
    initializer: dict | None = None
    """TrainJob only: its `spec.initializer`, what Kubeflow Trainer's model and dataset initializers fetch
    (`kinds/trainjob/initializers.py`); a PyTorchJob refuses one."""


# Everything that decides one stage's job, whatever its kind (`kinds/pytorchjob/manifest.py`,
# `kinds/trainjob/request.py`): `JobFields`, and each pod option `settings/options.py` declares for the job spec.
JobSpec = make_dataclass("JobSpec", job_spec_fields(), bases=(JobFields,), kw_only=True, slots=True,
                         namespace={"__module__": __name__, "__doc__": "A stage's job: `JobFields` and the pod "
                                    "options (settings/options.py, `in_job_spec`)."})


def derive_job_name(run_id: str, task: str) -> str:
    """A stable DNS-1035 name for one task of one pipeline run.

    The same run and task always give the same name, so a retried task finds (and re-attaches
    to) the job its first attempt created instead of starting a second one.
    """
    digest = hashlib.sha256(f"{run_id}/{task}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", task.lower()).strip("-")[:40] or "stage"
    return f"af-{stem}-{digest}"


def job_labels(spec: JobSpec) -> dict[str, str]:
    """The job's own labels, whatever its kind: the stage, the run (`spec.labels`) and the Kueue queue."""
    labels = {"app.kubernetes.io/name": "alignflow", "alignflow/stage": spec.stage, **spec.labels}
    if spec.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = spec.kueue_queue
    return labels
