"""Kubeflow Trainer's dataset and model initializers, emulated: what the controller does to their jobs' pods.

Kept apart from the controller (`trainer_controller.py`), which runs them: each initializer replicated job (labelled
`trainjob-ancestor-step: dataset-initializer` / `model-initializer`) is one pod, and the trainer's job starts once
every job in its `dependsOn` is Complete (JobSet's `dependsOn`). What each piece follows upstream (kubeflow/trainer
at 8c0f5059):

- `admission_problems`: the webhook's check (`plugins/jobset/jobset.go` Validate) that a TrainJob asking for a
  step's initializer references a runtime with that job, a container of that name, and its `initializer` volume
  mount;
- `apply_initializer`: the JobSet builder's `Initializer()` (`plugins/jobset/builder.go`): into the container named
  like the step, `STORAGE_URI` from `spec.initializer.<dataset|model>.storageUri` and the step's `env` are upserted
  and its `secretRef` becomes an `envFrom`;
- `claim_volumes`: JobSet's `volumeClaimPolicies`: one claim per JobSet and claim template (here
  `<template>-<jobset>`), added to every pod as a volume of the template's name (the kubelet binds each claim to a
  folder of this machine).

The images: `ghcr.io/kubeflow/trainer/{dataset,model}-initializer` run here as this machine's Python with
`initializer_image/` on PYTHONPATH, whose `pkg.initializers.{dataset,model}` (the modules the real images run) is a
stand-in that fetches an s3:// prefix from the object store the way the real one does (`initializer_image/pkg/
initializers/fetch.py`). hf:// cannot be fetched here (no Hub), and the stand-in says so and fails.
"""

from __future__ import annotations

import copy
from pathlib import Path

from tests.cluster.trainer_merge import ANCESTOR_LABEL, upsert_env

STEPS = {"dataset-initializer": "dataset", "model-initializer": "model"}  # job (and container) -> spec.initializer
VOLUME = "initializer"  # Trainer's VolumeNameInitializer
STANDIN_IMAGES = {"ghcr.io/kubeflow/trainer/": {"PYTHONPATH": str(Path(__file__).parent / "initializer_image")}}


def step_of(job: dict) -> str | None:
    """The initializer step a replicated job runs (its ancestor-step label), or None."""
    label = ((job.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL)
    return label if label in STEPS else None


def admission_problems(trainjob: dict, runtime: dict) -> list[str]:
    """What Trainer's webhook refuses about the initializers a TrainJob asks for."""
    problems = []
    jobs = {job["name"]: job for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for step, field in STEPS.items():
        if not (trainjob["spec"].get("initializer") or {}).get(field):
            continue
        ref = trainjob["spec"]["runtimeRef"]
        where = f"spec.runtimeRef: Invalid value: {ref}"
        if step not in jobs:
            problems.append(f"{where}: must have {step} job when trainJob is configured with input {field}Config")
            continue
        containers = {c["name"]: c for c in jobs[step]["template"]["spec"]["template"]["spec"].get("containers", [])}
        if step not in containers:
            problems.append(f"{where}: must have container with name - {step} in the {step} job")
        elif not any(mount["name"] == VOLUME for mount in containers[step].get("volumeMounts") or []):
            problems.append(f"{where}: must have volumeMount with name - {VOLUME} in container {step} of the {step} job")
    return problems


def apply_initializer(job: dict, trainjob: dict) -> dict:
    """The pod template of initializer job `job` after Trainer's builder (see the module docstring)."""
    step = step_of(job)
    template = copy.deepcopy(job["template"]["spec"]["template"])
    entry = (trainjob["spec"].get("initializer") or {}).get(STEPS[step]) if step else None
    for container in template["spec"]["containers"]:
        if container["name"] != step or not entry:
            continue
        if entry.get("storageUri"):
            container["env"] = upsert_env(container.get("env") or [], [{"name": "STORAGE_URI",
                                                                        "value": entry["storageUri"]}])
        container["env"] = upsert_env(container.get("env") or [], entry.get("env") or [])
        if entry.get("secretRef"):
            container["envFrom"] = [*(container.get("envFrom") or []), {"secretRef": {"name": entry["secretRef"]["name"]}}]
    return template


def claim_volumes(jobset_spec: dict, jobset: str) -> list[dict]:
    """The pods' volumes of the JobSet's `volumeClaimPolicies` (a claim per template, shared by every pod)."""
    return [{"name": template["metadata"]["name"],
             "persistentVolumeClaim": {"claimName": f"{template['metadata']['name']}-{jobset}"}}
            for policy in jobset_spec.get("volumeClaimPolicies") or [] for template in policy.get("templates") or []]
