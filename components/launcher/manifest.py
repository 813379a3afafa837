"""Build a `kubeflow.org/v1` PyTorchJob from a stage spec, checking what the CRD schema does not.

Every replica runs `python -m trainer.launch -m trainer <stage> --config <uri>` (torchrun, exiting
143 rather than 1 when preempted: see `trainer/launch.py`) in a container named `pytorch` (the
Training Operator requires that name). torchrun takes its topology from the `PET_*` variables the
operator injects, which is why the command carries no `--nnodes`/`--nproc_per_node` of its own.

- One node: a single Master replica (static rendezvous on itself).
- More nodes: `num_nodes` Worker replicas and an `elasticPolicy` with the c10d rendezvous backend
  (`minReplicas = maxReplicas = num_nodes`, `maxRestarts`). The operator points every worker at a
  rendezvous hosted by worker-0 (`PET_RDZV_ENDPOINT`, `PET_NNODES=n:n`), so a worker pod that the
  kubelet restarts after a failure rejoins the group, and the others restart their processes from
  the last checkpoint, instead of the whole job failing as it would with a static master/worker
  rendezvous. The operator's webhook requires Worker replicas when an elastic policy is set.

The pod itself (resources, placement, security context) is built in `pod_template.py`; the value
checks are in `manifest_checks.py`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from components.launcher.manifest_checks import check_spec
from components.launcher.pod_template import pod_template

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
    """Everything that decides one stage's job, whatever its kind (`build_pytorchjob` here, `trainjob_request.py`).

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


def is_elastic(spec: JobSpec) -> bool:
    return spec.num_nodes > 1


def _replica(spec: JobSpec, replicas: int, extra_env: list[dict] | None = None) -> dict:
    return {"replicas": replicas, "restartPolicy": spec.restart_policy, "template": pod_template(spec, extra_env)}


def _run_policy(spec: JobSpec) -> dict:
    policy: dict = {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": spec.clean_pod_policy}
    if spec.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    return policy


def job_labels(spec: JobSpec) -> dict[str, str]:
    """The job's own labels, whatever its kind: the stage, the run (`spec.labels`) and the Kueue queue."""
    labels = {"app.kubernetes.io/name": "alignflow", "alignflow/stage": spec.stage, **spec.labels}
    if spec.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = spec.kueue_queue
    return labels


def build_pytorchjob(spec: JobSpec) -> dict:
    """The PyTorchJob manifest for `spec` (checked first; raises LaunchError naming every problem)."""
    check_spec(spec, STAGES, kind="PyTorchJob")
    job_spec: dict = {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": _run_policy(spec)}
    if is_elastic(spec):
        # Without a Master replica the operator does not pass nprocPerNode on as PET_NPROC_PER_NODE.
        # With the rendezvous' TCPStore shared with the workers (torch's default since 2.4), a surviving rank-0
        # agent keeps the previous round's MASTER_ADDR/PORT and never publishes them for the next round, so a
        # restarted worker's agent waits for them until it times out and the job cannot rejoin
        # (pytorch/pytorch#135712): each round then gets its own store.
        extra = [{"name": "PET_NPROC_PER_NODE", "value": str(spec.nproc_per_node)},
                 {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"}]
        job_spec["pytorchReplicaSpecs"] = {"Worker": _replica(spec, spec.num_nodes, extra)}
        job_spec["elasticPolicy"] = {"rdzvBackend": "c10d", "rdzvId": spec.name, "minReplicas": spec.num_nodes,
                                     "maxReplicas": spec.num_nodes, "maxRestarts": spec.max_restarts}
    else:
        job_spec["pytorchReplicaSpecs"] = {"Master": _replica(spec, 1)}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(spec)},
        "spec": job_spec,
    }
