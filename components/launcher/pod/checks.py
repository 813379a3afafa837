"""Checks of a JobSpec's values that the job CRDs' schemas (PyTorchJob, TrainJob) do not make.

The CRD is shallow in places (a wrong `cleanPodPolicy` or restart policy passes it), says nothing
about names, quantities or a request above its limit, and the API server only finds some of these
when the operator creates the pods, long after the launcher reported success. Every problem is
collected and reported at once, naming the field.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from components.launcher.shared.quantities import quantity_value
from trainer.errors import LaunchError

if TYPE_CHECKING:
    from components.launcher.pod.spec import JobSpec

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# A URL whose user-info carries a password: `scheme://user:password@host`.
_URL_WITH_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def _check_names(spec: JobSpec, stages: tuple[str, ...], problems: list[str]) -> None:
    # The operator's webhook requires a DNS-1035 label: a letter first.
    if not _DNS_1035.match(spec.name) or len(spec.name) > 63:
        problems.append(f"name {spec.name!r} is not a DNS-1035 label of at most 63 characters")
    if spec.stage not in stages:
        problems.append(f"stage is {spec.stage!r}, expected one of {list(stages)}")
    for name in ("image", "config_uri"):
        if not getattr(spec, name):
            problems.append(f"{name} is empty")
    for name in ("service_account", "priority_class"):
        value = getattr(spec, name)
        if value and (not _DNS_SUBDOMAIN.match(value) or len(value) > 253):
            problems.append(f"{name} is {value!r}, expected a DNS-1123 subdomain")
    if spec.kueue_queue and (not _LABEL_VALUE.match(spec.kueue_queue) or len(spec.kueue_queue) > 63):
        problems.append(f"kueue_queue is {spec.kueue_queue!r}, expected a label value of at most 63 characters")
    if not _EXTENDED_RESOURCE.match(spec.gpu_resource):
        problems.append(f"gpu_resource is {spec.gpu_resource!r}, expected a domain-qualified extended resource "
                        "such as 'nvidia.com/gpu'")


def _check_counts(spec: JobSpec, problems: list[str]) -> None:
    if spec.num_nodes < 1:
        problems.append(f"num_nodes is {spec.num_nodes}, expected >= 1")
    if not (spec.nproc_per_node == "auto" or (isinstance(spec.nproc_per_node, int) and spec.nproc_per_node >= 1)):
        problems.append(f"nproc_per_node is {spec.nproc_per_node!r}, expected 'auto' or an integer >= 1")
    minimums = {"gpus_per_node": 0, "backoff_limit": 0, "max_restarts": 0, "termination_grace_period_seconds": 0,
                "run_as_user": 1, "run_as_group": 1}
    for name, minimum in minimums.items():
        if getattr(spec, name) < minimum:
            problems.append(f"{name} is {getattr(spec, name)}, expected >= {minimum}"
                            + (" (the restricted Pod Security Standard forbids root)" if minimum == 1 else ""))
    for name, minimum in (("active_deadline_seconds", 1), ("ttl_seconds_after_finished", 0)):
        value = getattr(spec, name)
        if value is not None and value < minimum:
            problems.append(f"{name} is {value}, expected a positive number of seconds")
    if spec.restart_policy not in RESTART_POLICIES:
        problems.append(f"restart_policy is {spec.restart_policy!r}, expected one of {list(RESTART_POLICIES)}")
    if spec.clean_pod_policy not in CLEAN_POD_POLICIES:
        problems.append(f"clean_pod_policy is {spec.clean_pod_policy!r}, expected one of {list(CLEAN_POD_POLICIES)}")


def _check_resources(spec: JobSpec, problems: list[str]) -> None:
    values = {}
    for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit", "shm_size"):
        value = getattr(spec, name)
        if value is None:
            continue
        values[name] = quantity_value(value)
        if values[name] is None:
            problems.append(f"{name} is {value!r}, expected a Kubernetes quantity such as '8', '500m' or '16Gi'")
    for kind in ("cpu", "memory"):
        request, limit = values.get(f"{kind}_request"), values.get(f"{kind}_limit")
        if request is not None and limit is not None and request > limit:
            problems.append(f"{kind}_request {getattr(spec, kind + '_request')!r} is above "
                            f"{kind}_limit {getattr(spec, kind + '_limit')!r}")


def _check_placement(spec: JobSpec, problems: list[str]) -> None:
    if not isinstance(spec.affinity, dict):
        problems.append(f"affinity is {type(spec.affinity).__name__}, expected a mapping (core/v1 Affinity)")
    for index, toleration in enumerate(spec.tolerations):
        if not isinstance(toleration, dict):
            problems.append(f"tolerations[{index}] is not a mapping")
            continue
        operator, effect = toleration.get("operator", "Equal"), toleration.get("effect", "")
        if operator not in TOLERATION_OPERATORS:
            problems.append(f"tolerations[{index}].operator is {operator!r}, "
                            f"expected one of {list(TOLERATION_OPERATORS)}")
        if effect and effect not in TOLERATION_EFFECTS:
            problems.append(f"tolerations[{index}].effect is {effect!r}, expected one of {list(TOLERATION_EFFECTS)}")


def _check_env(spec: JobSpec, problems: list[str]) -> None:
    for name, value in spec.env.items():
        if _URL_WITH_PASSWORD.match(str(value)):  # the value itself stays out of the message
            problems.append(f"env {name} is a URL with a password; pass credentials through a Secret (secret_env)")
    for item in spec.secret_env:
        if not (item.name and item.secret and item.key):
            problems.append(f"secret_env entry {item} needs name, secret and key")


def check_spec(spec: JobSpec, stages: tuple[str, ...], *, kind: str = "PyTorchJob",
               extra: list[str] | None = None) -> None:
    """Reject what the CRD would accept but the controller or the cluster would not. Raises LaunchError.

    Args:
        spec: The job's spec.
        stages: The trainer's sub-commands a job may run.
        kind: How the message names the job (`PyTorchJob`, `TrainJob`).
        extra: Problems the kind found itself, reported with these.
    """
    problems: list[str] = []
    _check_names(spec, stages, problems)
    for check in (_check_counts, _check_resources, _check_placement, _check_env):
        check(spec, problems)
    if spec.initializer and kind != "TrainJob":
        problems.append("initializer: only a TrainJob's runtime runs Kubeflow Trainer's model and dataset "
                        "initializers; a PyTorchJob's trainer reads s3:// itself")
    problems += extra or []
    if problems:
        raise LaunchError(f"{kind} {spec.name!r}: " + "; ".join(problems))
