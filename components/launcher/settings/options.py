"""The pod and platform options of a stage's job, each declared once: `POD_OPTIONS`.

One `PodOption` per knob says everything the launcher needs about it: the field name, its value's
kind (how a value is checked, and so its type: `KIND_TYPES`), its default, its description, the
variable the platform sets it with (the chart's defaults ConfigMap key, which the component pod gets
as environment), who may set it for one run, and where it lands in the pod. Everything else is derived from this table:

- the fields of `ClusterOptions` (stage_job.py) and of `JobSpec` (pod/spec.py), with their types and defaults;
- the platform's defaults read from the environment (`settings/platform.py`);
- which component parameters and which keys of a run's `scheduling` parameter may set an option,
  and how each value is checked (`settings/scheduling.py`, `stage_io.cluster_options`);
- the pass-through fields of the pods (`pod/template.py`, the TrainJob's runtime patch);
- the ConfigMap keys every pipeline task gets (`pipelines/options.py`).

So adding a knob is one entry here (tests/components/launcher/settings/test_options.py shows one
reaching all of them); only the chart's values (helm/alignflow) need the new key as well.

Two defaults used to disagree, and are settled here:
- `nproc_per_node` is 1, not `auto`: torchrun's `auto` starts one process per CPU core on a node
  without GPUs, which is never what a pod with a CPU request wants; the components set it to one
  per GPU (`stage_io.cluster_options`), so `auto` stays a value one can ask for, not a default.
- `namespace` is the component pod's own (`current_namespace`), not `default`: the chart's Role
  grants the launcher its rights there only, and outside a pod both are `default`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

# Who may set an option, from the widest to the narrowest.
RUN = "run"
"""A run's `scheduling` parameter, a component's parameter, or the platform."""
COMPONENT = "component"
"""A component's own parameter (what a pipeline author exposes), or the platform; not `scheduling`: these
decide whose quota, which account and how many GPUs a job gets, not how its pods are placed or sized."""
PLATFORM = "platform"
"""The platform only (policy: which Secrets, which namespace, which job kind)."""

# The type of an option's value, by its kind: what `settings/scheduling.check_value` turns a value of that kind into
# (a whole number of seconds stays an int, which `float` admits). An option whose default is None may also be None.
KIND_TYPES: dict[str, Any] = {
    "text": str, "job_kind": str, "quantity": str, "count": int, "count0": int, "nproc": int | str, "seconds": float,
    "object": dict[str, Any], "list": list[dict[str, Any]], "flag": bool,
}


def current_namespace() -> str:
    """The namespace this pod runs in (where KFP runs the component), else `default`."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as handle:
            return handle.read().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True, slots=True)
class PodOption:
    """One knob of a stage's job (see the module docstring)."""

    name: str
    """The field of `ClusterOptions` (and of `JobSpec` when `in_job_spec`), the component parameter and the
    `scheduling` key."""
    kind: str
    """How a value is checked: one of `settings/scheduling.py`'s EXPECTED kinds."""
    default: Any
    """The default; a callable is called for each new object (a mutable or a computed default)."""
    description: str
    variable: str = ""
    """The environment variable (= the defaults ConfigMap key) the platform sets it with; "" when none."""
    set_by: str = COMPONENT
    """Who may set it for one run: RUN, COMPONENT or PLATFORM."""
    pod_field: str = ""
    """The pod spec field the value is copied to, unchanged, when it is set; "" when the builders place it."""
    in_job_spec: bool = True
    """Whether the job's spec carries it (False: the launcher's own, such as how long it waits)."""

    @property
    def annotation(self) -> Any:
        """The type of the option's value (`KIND_TYPES`), or None as well where that is the default."""
        return KIND_TYPES[self.kind] | None if self.default is None else KIND_TYPES[self.kind]

    def dataclass_field(self) -> tuple[str, Any, Any]:
        """(name, type, field) for `dataclasses.make_dataclass`."""
        if callable(self.default):
            value = dataclasses.field(default_factory=self.default, metadata={"description": self.description})
        else:
            value = dataclasses.field(default=self.default, metadata={"description": self.description})
        return self.name, self.annotation, value


POD_OPTIONS: tuple[PodOption, ...] = (
    PodOption("namespace", "text", current_namespace, "Where the job runs: the component pod's own namespace.",
              set_by=PLATFORM),
    PodOption("job_kind", "job_kind", "auto", "On Kubernetes: `trainjob`, `pytorchjob`, or `auto` (TrainJob where "
              "the cluster serves it, see kinds/choice.py).", "ALIGNFLOW_JOB_KIND", PLATFORM, in_job_spec=False),
    PodOption("trainer_runtime", "text", "torch-distributed", "The TrainingRuntime or ClusterTrainingRuntime a "
              "TrainJob references (the chart's own by default).", "ALIGNFLOW_TRAINER_RUNTIME", PLATFORM,
              in_job_spec=False),
    PodOption("initializers", "flag", False, "Whether a TrainJob's `model.path` and `data.*` (hf:// or s3://) are "
              "fetched once by Kubeflow Trainer's model and dataset initializers into the runtime's shared volume "
              "(kinds/trainjob/initializers.py); the chart's `training.initializers.enabled`. Off, and for a "
              "PyTorchJob: the trainer reads s3:// itself, and hf:// is refused.", "ALIGNFLOW_INITIALIZERS", PLATFORM,
              in_job_spec=False),
    PodOption("num_nodes", "count", 1, "Pods; more than one runs an elastic PyTorchJob of Worker replicas (c10d "
              "rendezvous), or a TrainJob of that many nodes (static rendezvous on node 0)."),
    PodOption("nproc_per_node", "nproc", 1, "Processes per pod: an integer, or `auto` (torchrun: one per GPU, "
              "else one per CPU core)."),
    PodOption("gpus_per_node", "count0", 0, "GPUs each pod requests (and is limited to)."),
    PodOption("gpu_resource", "text", "nvidia.com/gpu", "The extended resource that counts GPUs "
              "(`nvidia.com/mig-1g.10gb`, `amd.com/gpu`, ...).", "ALIGNFLOW_GPU_RESOURCE", RUN),
    PodOption("cpu_request", "quantity", None, "CPU each pod requests, as a Kubernetes quantity (`8`, `500m`); "
              "None requests none.", "ALIGNFLOW_CPU_REQUEST", RUN),
    PodOption("cpu_limit", "quantity", None, "CPU each pod is limited to; None: no limit.", "ALIGNFLOW_CPU_LIMIT",
              RUN),
    PodOption("memory_request", "quantity", None, "Memory each pod requests (`64Gi`); None requests none.",
              "ALIGNFLOW_MEMORY_REQUEST", RUN),
    PodOption("memory_limit", "quantity", None, "Memory each pod is limited to; None: no limit.",
              "ALIGNFLOW_MEMORY_LIMIT", RUN),
    PodOption("shm_size", "quantity", "2Gi", "Size of each pod's in-memory /dev/shm (DataLoader workers and NCCL "
              "use it).", "ALIGNFLOW_SHM_SIZE", RUN),
    PodOption("node_selector", "object", dict, "The pods' nodeSelector.", "ALIGNFLOW_NODE_SELECTOR", RUN,
              "nodeSelector"),
    PodOption("tolerations", "list", list, "The pods' tolerations.", "ALIGNFLOW_TOLERATIONS", RUN, "tolerations"),
    PodOption("affinity", "object", dict, "The pods' core/v1 Affinity (nodeAffinity, podAffinity, "
              "podAntiAffinity), passed through.", "ALIGNFLOW_AFFINITY", RUN, "affinity"),
    PodOption("service_account", "text", None, "The pods' ServiceAccount.", "ALIGNFLOW_SERVICE_ACCOUNT",
              pod_field="serviceAccountName"),
    PodOption("priority_class", "text", None, "The pods' PriorityClass (also what Kueue uses as the workload's "
              "priority).", "ALIGNFLOW_PRIORITY_CLASS", pod_field="priorityClassName"),
    PodOption("kueue_queue", "text", None, "Kueue LocalQueue: the job's `kueue.x-k8s.io/queue-name` label; None: "
              "not queued by Kueue.", "ALIGNFLOW_KUEUE_QUEUE"),
    PodOption("active_deadline_seconds", "seconds", None, "The controller stops the job after this long "
              "(`activeDeadlineSeconds`); None (or 0 in the ConfigMap): no deadline.",
              "ALIGNFLOW_ACTIVE_DEADLINE_SECONDS", RUN),
    PodOption("termination_grace_period_seconds", "count0", 30, "The least `terminationGracePeriodSeconds` of the "
              "pods: a stage whose `checkpoint.preemption_grace_seconds` needs more gets that plus a margin "
              "(stage_job.termination_grace_seconds)."),
    PodOption("max_restarts", "count0", 3, "Elastic PyTorchJobs: worker-group restarts torchrun allows (a "
              "restarted pod rejoining counts once)."),
    PodOption("run_as_user", "count", 1000, "Non-root uid of the pods (the trainer image's `alignflow` user)."),
    PodOption("run_as_group", "count", 1000, "Non-root gid of the pods."),
    # Pod restarts inside the job; KFP's own task retries (pipelines/options.py) come on top. The operator fails
    # the job once the running pods' restart count reaches backoffLimit, so 2 lets one restarted container (a
    # worker of an elastic job rejoining) finish the job; 1 would fail it at its first restart.
    PodOption("backoff_limit", "count0", 2, "Pod restarts before the job counts as failed (PyTorchJob only)."),
    PodOption("s3_secret", "text", "", "Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; empty: none.",
              "ALIGNFLOW_S3_SECRET", in_job_spec=False),
    PodOption("mlflow_secret", "text", "", "Secret with MLFLOW_TRACKING_USERNAME/_PASSWORD/_TOKEN (each "
              "optional); empty: none.", "ALIGNFLOW_MLFLOW_SECRET", PLATFORM, in_job_spec=False),
    PodOption("mlflow_token_audience", "text", "", "Audience of the service-account token the pods show MLflow "
              "for its `kubernetes` auth (pod/mlflow_token.py); empty: the pods get no token.",
              "ALIGNFLOW_MLFLOW_TOKEN_AUDIENCE", PLATFORM),
    PodOption("timeout_seconds", "seconds", 86400.0, "The launcher's own deadline for the whole job.", set_by=RUN,
              in_job_spec=False),
    PodOption("pending_timeout_seconds", "seconds", 900.0, "How long a pod may stay Pending for a reported reason "
              "(unschedulable, image pull) before the task fails.", "ALIGNFLOW_PENDING_TIMEOUT_SECONDS", RUN,
              in_job_spec=False),
    PodOption("poll_seconds", "seconds", 10.0, "How often the launcher looks at the job's pods, their events and "
              "the trainer's log.", "ALIGNFLOW_POLL_SECONDS", RUN, in_job_spec=False),
)


def options_set_by(*who: str) -> dict[str, PodOption]:
    """The options that `who` (RUN, COMPONENT, PLATFORM) may set, by name."""
    return {option.name: option for option in POD_OPTIONS if option.set_by in who}


def option_variables() -> tuple[str, ...]:
    """The environment variables (defaults ConfigMap keys) the platform sets options with."""
    return tuple(option.variable for option in POD_OPTIONS if option.variable)


def job_spec_fields() -> list[tuple[str, Any, Any]]:
    """The `JobSpec` fields the options make (see `PodOption.in_job_spec`)."""
    return [option.dataclass_field() for option in POD_OPTIONS if option.in_job_spec]


def cluster_fields() -> list[tuple[str, Any, Any]]:
    """The `ClusterOptions` fields the options make (all of them)."""
    return [option.dataclass_field() for option in POD_OPTIONS]


def pod_fields(values: Any, skip: Callable[[str], bool] = lambda field: False) -> dict[str, Any]:
    """The pass-through pod spec fields of `values` (a JobSpec) that are set, copied (`PodOption.pod_field`)."""
    import copy

    fields = {option.pod_field: copy.deepcopy(getattr(values, option.name)) for option in POD_OPTIONS
              if option.pod_field and not skip(option.pod_field)}
    return {field: value for field, value in fields.items() if value}
