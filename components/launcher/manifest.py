"""Build a `kubeflow.org/v1` PyTorchJob from a stage spec, checking what the CRD schema does not.

The job has a Master replica and `num_nodes - 1` Worker replicas, each running
`torchrun -m trainer <stage> --config <uri>` in a container named `pytorch` (the Training Operator
requires that name). torchrun takes its topology from the `PET_*` variables the operator injects,
which is why the command carries no `--nnodes`/`--nproc_per_node` of its own.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from trainer.errors import LaunchError

STAGES = ("sft", "rm", "dpo", "ppo", "grpo")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(slots=True)
class SecretEnv:
    """An environment variable read from a key of an existing Kubernetes Secret."""

    name: str
    secret: str
    key: str


@dataclass(slots=True)
class JobSpec:
    """Everything that decides one stage's PyTorchJob."""

    name: str
    stage: str
    config_uri: str
    image: str
    namespace: str = "default"
    num_nodes: int = 1
    nproc_per_node: int | str = "auto"
    gpus_per_node: int = 0
    cpu: str | None = None
    memory: str | None = None
    shm_size: str = "2Gi"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[SecretEnv] = field(default_factory=list)
    service_account: str | None = None
    restart_policy: str = "OnFailure"
    backoff_limit: int = 2
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = 3600
    clean_pod_policy: str = "None"
    extra_args: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


def derive_job_name(run_id: str, task: str) -> str:
    """A stable DNS-1123 name for one task of one pipeline run.

    The same run and task always give the same name, so a retried task finds (and re-attaches
    to) the job its first attempt created instead of starting a second one.
    """
    digest = hashlib.sha256(f"{run_id}/{task}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", task.lower()).strip("-")[:40] or "stage"
    return f"af-{stem}-{digest}"


def check_spec(spec: JobSpec) -> None:
    """Reject what the CRD would accept but the operator or the cluster would not. Raises LaunchError."""
    problems = []
    if not _DNS_LABEL.match(spec.name) or len(spec.name) > 63:
        problems.append(f"name {spec.name!r} is not a DNS-1123 label of at most 63 characters")
    if spec.stage not in STAGES:
        problems.append(f"stage is {spec.stage!r}, expected one of {list(STAGES)}")
    if not spec.image:
        problems.append("image is empty")
    if not spec.config_uri:
        problems.append("config_uri is empty")
    if spec.num_nodes < 1:
        problems.append(f"num_nodes is {spec.num_nodes}, expected >= 1")
    if not (spec.nproc_per_node == "auto" or (isinstance(spec.nproc_per_node, int) and spec.nproc_per_node >= 1)):
        problems.append(f"nproc_per_node is {spec.nproc_per_node!r}, expected 'auto' or an integer >= 1")
    if spec.gpus_per_node < 0:
        problems.append(f"gpus_per_node is {spec.gpus_per_node}, expected >= 0")
    if spec.restart_policy not in RESTART_POLICIES:
        problems.append(f"restart_policy is {spec.restart_policy!r}, expected one of {list(RESTART_POLICIES)}")
    if spec.clean_pod_policy not in CLEAN_POD_POLICIES:
        problems.append(f"clean_pod_policy is {spec.clean_pod_policy!r}, expected one of {list(CLEAN_POD_POLICIES)}")
    if spec.backoff_limit < 0:
        problems.append(f"backoff_limit is {spec.backoff_limit}, expected >= 0")
    for name in ("active_deadline_seconds", "ttl_seconds_after_finished"):
        value = getattr(spec, name)
        if value is not None and value < (1 if name == "active_deadline_seconds" else 0):
            problems.append(f"{name} is {value}, expected a positive number of seconds")
    for name in ("cpu", "memory", "shm_size"):
        value = getattr(spec, name)
        if value is not None and not _QUANTITY.match(str(value)):
            problems.append(f"{name} is {value!r}, expected a Kubernetes quantity such as '8', '500m' or '16Gi'")
    for item in spec.secret_env:
        if not (item.name and item.secret and item.key):
            problems.append(f"secret_env entry {item} needs name, secret and key")
    if problems:
        raise LaunchError(f"PyTorchJob {spec.name!r}: " + "; ".join(problems))


def _container(spec: JobSpec) -> dict:
    env = [{"name": k, "value": str(v)} for k, v in sorted(spec.env.items())]
    env += [{"name": s.name, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}}
            for s in spec.secret_env]
    resources: dict[str, dict] = {}
    requests = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v is not None}
    if requests:
        resources["requests"] = dict(requests)
    if spec.gpus_per_node:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = spec.gpus_per_node
        resources.setdefault("requests", {})["nvidia.com/gpu"] = spec.gpus_per_node
    return {
        "name": "pytorch",  # the Training Operator finds the training container by this name
        "image": spec.image,
        "command": ["torchrun", "-m", "trainer", spec.stage, "--config", spec.config_uri, *spec.extra_args],
        "env": env,
        "resources": resources,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _replica(spec: JobSpec, replicas: int) -> dict:
    pod_spec = {
        "containers": [_container(spec)],
        # DataLoader workers and NCCL use shared memory; the container default (64Mi) is too small.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    return {"replicas": replicas, "restartPolicy": spec.restart_policy,
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": "alignflow", **spec.labels}},
                         "spec": pod_spec}}


def build_pytorchjob(spec: JobSpec) -> dict:
    """The PyTorchJob manifest for `spec` (checked first; raises LaunchError naming every problem)."""
    check_spec(spec)
    run_policy = {"backoffLimit": spec.backoff_limit, "cleanPodPolicy": spec.clean_pod_policy}
    if spec.active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    replica_specs = {"Master": _replica(spec, 1)}
    if spec.num_nodes > 1:
        replica_specs["Worker"] = _replica(spec, spec.num_nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/name": "alignflow", "alignflow/stage": spec.stage, **spec.labels}},
        "spec": {"nprocPerNode": str(spec.nproc_per_node), "runPolicy": run_policy,
                 "pytorchReplicaSpecs": replica_specs},
    }
