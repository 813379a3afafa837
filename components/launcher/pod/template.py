"""The pod every replica of a stage's job runs: container, command, resources, placement, security, /dev/shm.

The PyTorchJob's pod template is built here whole; the TrainJob's pods (`kinds/trainjob/request.py`)
get the same pieces (`stage_command`, `shm_volume`, `pod_labels`, `pass_through_fields`, the security
contexts) through the Kubeflow SDK.

Security: every pod meets the Pod Security Standards' "restricted" profile, so the job runs in a
namespace labelled `pod-security.kubernetes.io/enforce: restricted`:

- the pod runs as a non-root user (`runAsNonRoot`, `runAsUser`/`runAsGroup`/`fsGroup`, 1000 by
  default: the `alignflow` user of images/trainer/Dockerfile) with the runtime's default seccomp
  profile (`seccompProfile: RuntimeDefault`);
- the `pytorch` container cannot gain privileges (`allowPrivilegeEscalation: false`) and drops
  every Linux capability (`capabilities.drop: [ALL]`);
- the only volumes are an in-memory `emptyDir` for /dev/shm (no hostPath) and, where the platform
  enables it, a token for MLflow alone (`mlflow_token.py`); the service account's own token is not
  mounted: the trainer never talks to the Kubernetes API.

What a GPU pod needs on top: nothing. With the NVIDIA device plugin (or the GPU Operator, which
installs it) a container gets its GPUs by requesting the extended resource (`nvidia.com/gpu`, or
`gpu_resource` for MIG slices and other vendors); the plugin and the NVIDIA container runtime
mount the device nodes and driver libraries. No privileged mode, added capability, hostPath or
root user is needed; only the device plugin's own DaemonSet is privileged.

What this module leaves out: the job-level fields (replica counts, run policy, elastic policy) are
in `kinds/pytorchjob/manifest.py`, and the checks of a spec's values are in `checks.py`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from components.launcher.pod.mlflow_token import mlflow_token_mounts, mlflow_token_volumes
from components.launcher.settings.options import pod_fields

if TYPE_CHECKING:
    from components.launcher.pod.spec import JobSpec

CONTAINER_NAME = "pytorch"  # the Training Operator finds the training container by this name
# The port named `pytorchjob-port` is where the operator points MASTER_PORT and the elastic
# rendezvous endpoint (`<job>-worker-0:<port>`); 23456 is the operator's own default.
RENDEZVOUS_PORT = {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}
# torchrun, run by `trainer.launch` so a preempted job exits 143 (retryable), not torchrun's 1.
LAUNCH_COMMAND = ("python", "-m", "trainer.launch")
SHM_VOLUME = "dshm"


def security_contexts(spec: JobSpec) -> tuple[dict, dict]:
    """(pod, container) security contexts meeting the "restricted" Pod Security Standard."""
    pod = {"runAsNonRoot": True, "runAsUser": spec.run_as_user, "runAsGroup": spec.run_as_group,
           "fsGroup": spec.run_as_group, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    return pod, container


def resources(spec: JobSpec) -> dict:
    """Requests and limits; GPUs are an extended resource, so their request equals their limit."""
    requests = {k: v for k, v in (("cpu", spec.cpu_request), ("memory", spec.memory_request)) if v is not None}
    limits = {k: v for k, v in (("cpu", spec.cpu_limit), ("memory", spec.memory_limit)) if v is not None}
    if spec.gpus_per_node:
        requests[spec.gpu_resource] = limits[spec.gpu_resource] = spec.gpus_per_node
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def plain_environment(spec: JobSpec) -> dict[str, str]:
    """The container's plain (not secret) environment, whatever the job's kind."""
    # torchrun's agent waits this long for its workers after forwarding SIGTERM before it kills them
    # (torch's default: 30 s); as long as the pod's grace period, it never cuts a stopping checkpoint short.
    plain = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": spec.termination_grace_period_seconds, **spec.env}
    return {key: str(value) for key, value in sorted(plain.items())}


def environment(spec: JobSpec) -> list[dict]:
    """Plain values first, then values read from Secrets (never copied into the manifest)."""
    env = [{"name": k, "value": v} for k, v in plain_environment(spec).items()]
    for item in spec.secret_env:
        reference = {"name": item.secret, "key": item.key}
        if item.optional:
            reference["optional"] = True
        env.append({"name": item.name, "valueFrom": {"secretKeyRef": reference}})
    return env


def stage_command(spec: JobSpec, launch_options: tuple[str, ...] = ()) -> list[str]:
    """`python -m trainer.launch [launch_options] -m trainer <stage> --config <uri> [extra args]`."""
    return [*LAUNCH_COMMAND, *launch_options, "-m", "trainer", spec.stage, "--config", spec.config_uri,
            *spec.extra_args]


def shm_volume(spec: JobSpec) -> dict:
    """The in-memory /dev/shm volume: DataLoader workers and NCCL use shared memory, and the container
    default (64Mi) is too small."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}


def shm_mount() -> dict:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def pod_labels(spec: JobSpec) -> dict[str, str]:
    """The pods' labels: the app's name and the spec's own (the run)."""
    return {"app.kubernetes.io/name": "alignflow", **spec.labels}


def pass_through_fields(spec: JobSpec, skip: Collection[str] = ()) -> dict[str, Any]:
    """The pod spec fields the options pass through unchanged (`PodOption.pod_field`) that are set, except `skip`."""
    return pod_fields(spec, skip=lambda field: field in skip)


def container(spec: JobSpec) -> dict:
    _, security = security_contexts(spec)
    return {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": stage_command(spec),
        "env": environment(spec),
        "ports": [dict(RENDEZVOUS_PORT)],
        "resources": resources(spec),
        "securityContext": security,
        "volumeMounts": [shm_mount(), *mlflow_token_mounts(spec)],
    }


def pod_template(spec: JobSpec, extra_env: list[dict] | None = None) -> dict:
    """The replica's pod template; `extra_env` is appended to the container's environment."""
    pod_security, _ = security_contexts(spec)
    main = container(spec)
    main["env"] += extra_env or []
    pod = {
        "containers": [main],
        "volumes": [shm_volume(spec), *mlflow_token_volumes(spec)],
        "securityContext": pod_security,
        "automountServiceAccountToken": False,
        # The trainer saves a checkpoint when it receives SIGTERM; this is how long it gets.
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
    }
    pod.update(pass_through_fields(spec))  # placement, account, priority (settings/options.py)
    return {"metadata": {"labels": pod_labels(spec)}, "spec": pod}
