"""Everything that decides one stage's job, whatever its kind: `JobSpec`, its Secrets, its name and labels.

The PyTorchJob manifest (`kinds/pytorchjob/manifest.py`) and the TrainJob request
(`kinds/trainjob/request.py`) are both built from a `JobSpec`; the pod they share is `template.py`'s,
and the checks of its values are `checks.py`'s. This module imports neither.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

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
class JobSpec:
    """Everything that decides one stage's job, whatever its kind (`kinds/pytorchjob/manifest.py`, `kinds/trainjob/request.py`).

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
    namespace: str = "default"
    num_nodes: int = 1
    """Pods; more than one makes an elastic job of Worker replicas."""
    nproc_per_node: int | str = "auto"
    """Processes per pod: an integer, or `auto` (one per GPU, else one)."""
    gpus_per_node: int = 0
    """GPUs each pod requests (and is limited to)."""
    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource that counts GPUs (`nvidia.com/mig-1g.10gb`, `amd.com/gpu`, ...)."""
    cpu_request: str | None = None
    """CPU each pod requests, as a Kubernetes quantity (`8`, `500m`); None requests none."""
    cpu_limit: str | None = None
    memory_request: str | None = None
    """Memory each pod requests (`64Gi`); None requests none."""
    memory_limit: str | None = None
    shm_size: str = "2Gi"
    """Size of the in-memory /dev/shm (DataLoader workers and NCCL use it)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    affinity: dict = field(default_factory=dict)
    """A core/v1 Affinity (nodeAffinity, podAffinity, podAntiAffinity), passed through."""
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment values; never credentials (rejected when a URL carries a password)."""
    secret_env: list[SecretEnv] = field(default_factory=list)
    service_account: str | None = None
    priority_class: str | None = None
    """The pods' PriorityClass (also what Kueue uses as the workload's priority)."""
    kueue_queue: str | None = None
    """Kueue LocalQueue: sets the `kueue.x-k8s.io/queue-name` label on the job."""
    termination_grace_period_seconds: int = 30
    """Seconds between SIGTERM and SIGKILL; the trainer checkpoints on SIGTERM within it."""
    run_as_user: int = 1000
    """Non-root uid of the pods (the trainer image's `alignflow` user)."""
    run_as_group: int = 1000
    restart_policy: str = "OnFailure"
    """PyTorchJob only."""
    backoff_limit: int = 2
    """Pod restarts before the job counts as failed (PyTorchJob only)."""
    max_restarts: int = 3
    """Elastic PyTorchJobs: how often torchrun restarts the worker group (a pod rejoining counts once)."""
    active_deadline_seconds: int | None = None
    """`runPolicy.activeDeadlineSeconds`: the operator stops the job after this long."""
    ttl_seconds_after_finished: int | None = 3600
    """PyTorchJob only."""
    clean_pod_policy: str = "None"
    """PyTorchJob only."""
    extra_args: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """Labels of the job and of its pods."""


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
