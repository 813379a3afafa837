"""What the launcher asks the Kubeflow SDK to create for a stage: a TrainJob's trainer and options.

The SDK's `TrainerClient.train` builds and creates the TrainJob from a `CustomTrainerContainer`
(image, nodes, resources per node, plain env) and options (`Name`, `Labels`, `TrainerCommand`,
`RuntimePatch`, `ActiveDeadlineSeconds`); the runtime (`runtimeRef`) holds the rest (`kinds/choice.py`,
the chart's TrainingRuntime). Everything a PyTorchJob pod gets reaches the TrainJob's pods:

| PyTorchJob (pytorchjob/manifest.py, pod/template.py) | TrainJob |
|---|---|
| container `pytorch`, image, command | `trainer.image`; `trainer.command` (`TrainerCommand`) in container `node` |
| `nprocPerNode` | `--nproc-per-node` on the command (below) |
| Master/Worker replicas | `trainer.numNodes` |
| plain env | `trainer.env` |
| env from Secrets (`secretKeyRef`) | Secret volumes (runtime patch), exported by `trainer.launch` (below) |
| resources (requests, limits, GPUs) | `trainer.resourcesPerNode` (requests equal limits, below) |
| `/dev/shm` volume, MLflow token volume, node selector, tolerations, affinity, service account, security contexts, pod labels | runtime patch (the SDK's `RuntimePatch`) |
| `terminationGracePeriodSeconds`, other options passed through to the pod | a second runtime patch (`PodFields`, below) |
| job labels, Kueue queue label | TrainJob labels (`Labels`) |
| `runPolicy.activeDeadlineSeconds` | `spec.activeDeadlineSeconds` (`ActiveDeadlineSeconds`) |
| priority class, no service-account token, restart and failure policy | the runtime (the chart renders them from the same values) |
| (the trainer reads s3:// itself) | with ALIGNFLOW_INITIALIZERS: `spec.initializer` (the SDK's `Initializer`, `initializers.py`) |

Where the SDK falls short, and what is done instead:
- `CustomTrainerContainer.env` takes plain strings only, and Kubeflow Trainer's webhook refuses env in
  a runtime patch of the `node` container, so a Secret cannot reach the trainer as `secretKeyRef`
  env. Each Secret is mounted read-only under `/var/run/secrets/alignflow/<secret>` (only the keys
  used, each as a file named after its variable), and `ALIGNFLOW_SECRET_ENV_DIRS` lists the folders;
  `trainer.launch` exports those files as environment variables before torchrun starts. The
  credentials still never enter the manifest.
- The SDK cannot set `trainer.numProcPerNode`, and without it the torch plugin gives a CPU-only node
  as many processes as it requests CPUs; the command passes `--nproc-per-node` to torchrun, whose
  options win over the plugin's `PET_NPROC_PER_NODE`.
- `resources_per_node` sets each resource's limit equal to its request. A request alone or a limit
  alone becomes both; a request different from its limit is refused (naming both), not changed.
- The SDK's `PodSpecPatch` has no `terminationGracePeriodSeconds` (the TrainJob API has it): a small
  option of ours adds that patch under its own manager name.
- The names the torch plugin sets (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
  PET_MASTER_PORT) are refused in the env before anything is created (the webhook would refuse
  the TrainJob).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from components.launcher.kinds.trainjob.initializers import sdk_initializer
from components.launcher.pod.checks import check_spec
from components.launcher.pod.mlflow_token import mlflow_token_mounts, mlflow_token_volumes
from components.launcher.pod.spec import STAGES, job_labels
from components.launcher.pod.template import (
    pass_through_fields,
    plain_environment,
    pod_labels,
    security_contexts,
    shm_mount,
    shm_volume,
    stage_command,
)
from components.launcher.shared.quantities import quantity_value
from trainer.secret_keys import SECRET_DIRS_VARIABLE

if TYPE_CHECKING:
    from components.launcher.pod.spec import JobSpec, SecretEnv

NODE = "node"  # the replicated job and the container the torch plugin configures
SECRET_ROOT = "/var/run/secrets/alignflow"
PATCH_MANAGER = "alignflow.dev/launcher"  # our own runtime patch; the SDK's is trainer.kubeflow.org/kubeflow-sdk
TORCH_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# Pass-through pod fields the SDK's PodSpecPatch sets (pod field -> its argument), and those the runtime sets
# (the chart renders the TrainingRuntime from the same values); any other goes into our own patch (PodFields).
SDK_POD_FIELDS = {"nodeSelector": "node_selector", "tolerations": "tolerations", "affinity": "affinity",
                  "serviceAccountName": "service_account_name"}
RUNTIME_POD_FIELDS = ("priorityClassName",)


@dataclass(slots=True)
class TrainJobRequest:
    """One stage's TrainJob as the SDK's `train` takes it."""

    namespace: str
    name: str
    trainer: Any
    """A `kubeflow.trainer.CustomTrainerContainer`."""
    options: list = field(default_factory=list)
    initializer: Any = None
    """A `kubeflow.trainer.Initializer` (what Trainer's model and dataset initializers fetch), or None."""


@dataclass
class PodFields:
    """A runtime patch that sets fields of the trainer pods' spec the SDK's `PodSpecPatch` lacks (a
    `TrainerClient.train` option, like the SDK's own): `terminationGracePeriodSeconds`, and any option
    passed through to the pod (`PodOption.pod_field`) that neither the SDK's patch nor the runtime sets."""

    fields: dict[str, Any]

    def __call__(self, job_spec: dict, trainer: Any, backend: Any) -> None:
        patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": NODE, "template": {"spec": {"template": {"spec": dict(self.fields)}}}}]}}}}
        job_spec.setdefault("spec", {}).setdefault("runtimePatches", []).append(patch)


def resources_per_node(spec: JobSpec, problems: list[str]) -> dict[str, str]:
    """The SDK's `resources_per_node` (each value both request and limit); a conflict goes to `problems`."""
    resources = {}
    for kind in ("cpu", "memory"):
        request, limit = getattr(spec, f"{kind}_request"), getattr(spec, f"{kind}_limit")
        if request and limit and quantity_value(request) != quantity_value(limit):
            problems.append(f"{kind}_request {request!r} differs from {kind}_limit {limit!r}; a TrainJob created "
                            "through the Kubeflow SDK gets equal requests and limits: give one value")
        if limit or request:
            resources[kind] = str(limit or request)
    if spec.gpus_per_node:
        resources[spec.gpu_resource] = str(spec.gpus_per_node)
    return resources


def secret_volumes(secret_env: list[SecretEnv]) -> tuple[list[dict], list[dict], list[str]]:
    """(volumes, volume mounts, mounted folders): one read-only Secret volume per Secret (and optionality),
    holding only the keys used, each as a file named after its variable."""
    groups: dict[tuple[str, bool], list[SecretEnv]] = {}
    for item in secret_env:
        groups.setdefault((item.secret, item.optional), []).append(item)
    volumes, mounts, folders = [], [], []
    for index, ((secret, optional), items) in enumerate(groups.items()):
        name, folder = f"secret-env-{index}", f"{SECRET_ROOT}/{secret}" + ("-optional" if optional else "")
        source = {"secretName": secret, "items": [{"key": item.key, "path": item.name} for item in items]}
        if optional:
            source["optional"] = True
        volumes.append({"name": name, "secret": source})
        mounts.append({"name": name, "mountPath": folder, "readOnly": True})
        folders.append(folder)
    return volumes, mounts, folders


def trainer_command(spec: JobSpec) -> list[str]:
    """`python -m trainer.launch --nproc-per-node N -m trainer <stage> --config <uri>` (see the module docstring)."""
    return stage_command(spec, ("--nproc-per-node", str(spec.nproc_per_node)))


def pod_patch(spec: JobSpec, mounts: list[dict], volumes: list[dict]) -> Any:
    """The SDK's `RuntimePatch` of the `node` pods: volumes, placement, account, security, labels."""
    from kubeflow.trainer.options import (
        ContainerPatch,
        JobSetSpecPatch,
        JobSetTemplatePatch,
        JobSpecPatch,
        JobTemplatePatch,
        PodSpecPatch,
        PodTemplatePatch,
        ReplicatedJobPatch,
        RuntimePatch,
        TrainingRuntimeSpecPatch,
    )

    pod_security, container_security = security_contexts(spec)
    node = ContainerPatch(name=NODE, volume_mounts=[shm_mount(), *mlflow_token_mounts(spec), *mounts],
                          security_context=container_security)
    placement = pass_through_fields(spec)
    pod = PodSpecPatch(volumes=[shm_volume(spec), *mlflow_token_volumes(spec), *volumes], containers=[node],
                       security_context=pod_security,
                       **{argument: placement.get(field) for field, argument in SDK_POD_FIELDS.items()})
    job = JobTemplatePatch(spec=JobSpecPatch(template=PodTemplatePatch(metadata={"labels": pod_labels(spec)},
                                                                       spec=pod)))
    return RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(template=JobSetTemplatePatch(
        spec=JobSetSpecPatch(replicated_jobs=[ReplicatedJobPatch(name=NODE, template=job)]))))


def build_trainjob_request(spec: JobSpec) -> TrainJobRequest:
    """The TrainJob for `spec`, checked first (raises LaunchError naming every problem)."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import ActiveDeadlineSeconds, Labels, Name, TrainerCommand

    problems = [f"env {name} is set by Kubeflow Trainer's torch plugin; a TrainJob may not set it"
                for name in TORCH_RESERVED_ENV if name in spec.env]
    resources = resources_per_node(spec, problems)
    check_spec(spec, STAGES, kind="TrainJob", extra=problems)
    volumes, mounts, folders = secret_volumes(spec.secret_env)
    env = plain_environment(spec) | ({SECRET_DIRS_VARIABLE: ":".join(folders)} if folders else {})
    trainer = CustomTrainerContainer(image=spec.image, num_nodes=spec.num_nodes,
                                     resources_per_node=resources or None, env=env)
    own_fields = pass_through_fields(spec, skip=(*SDK_POD_FIELDS, *RUNTIME_POD_FIELDS))
    options = [Name(spec.name), Labels(job_labels(spec)), TrainerCommand(trainer_command(spec)),
               pod_patch(spec, mounts, volumes),
               PodFields({"terminationGracePeriodSeconds": spec.termination_grace_period_seconds, **own_fields})]
    if spec.active_deadline_seconds is not None:
        options.append(ActiveDeadlineSeconds(spec.active_deadline_seconds))
    initializer = sdk_initializer(spec.initializer) if spec.initializer else None
    return TrainJobRequest(spec.namespace, spec.name, trainer, options, initializer)
