"""How Kubeflow Trainer v2 turns a runtime's JobSet template and a TrainJob into the `node` pods' spec.

Kept apart from the controller (`trainer_controller.py`) so each file stays readable:

- `strategic_merge`: a TrainJob's runtime patches are merged into the runtime's JobSet spec in order
  with Kubernetes' strategic merge patch (`mergeRuntimePatches` in Trainer's
  `pkg/runtime/core/trainingruntime.go`): maps merge, `null` deletes, the lists Kubernetes marks with a
  merge key (replicated jobs, containers, volumes and env by name, volume mounts by mount path, ports by
  container port) merge item by item, other lists are replaced;
- `apply_trainer`: the TrainJob's trainer goes into container `node` of the replicated job whose
  template is labelled `trainjob-ancestor-step: trainer` (image, command, args, env upserted by name,
  `resourcesPerNode` merged over the runtime's resources), and the torch plugin's variables are upserted
  after it: PET_NNODES, PET_NPROC_PER_NODE (`numProcPerNode`; else `auto` with GPUs; else the CPU
  request, at least 1), PET_NODE_RANK from the completion index, PET_MASTER_ADDR
  `<job>-node-0-0.<job>` and PET_MASTER_PORT (a port of this machine, see the controller).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.cluster.scheduler import quantity

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name"}
TORCH_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def strategic_merge(base: Any, patch: Any, field_name: str = "") -> Any:
    """`patch` merged into `base` as a strategic merge patch of the JobSet and pod types would be."""
    if isinstance(patch, dict) and isinstance(base, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = strategic_merge(base.get(key), value, key)
        return merged
    if isinstance(patch, list) and isinstance(base, list) and field_name in MERGE_KEYS:
        key = MERGE_KEYS[field_name]
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            match = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
            if match is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[match] = strategic_merge(merged[match], item)
        return merged
    return copy.deepcopy(patch)


def merged_jobset_spec(runtime: dict, trainjob: dict) -> dict:
    """The runtime's JobSet spec with the TrainJob's runtime patches merged in, in order."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for patch in trainjob["spec"].get("runtimePatches") or []:
        patched = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        if patched:
            spec = strategic_merge(spec, patched)
    return spec


def upsert_env(env: list[dict], items: list[dict]) -> list[dict]:
    """`env` with each of `items` replacing the variable of its name, or appended."""
    result = [dict(item) for item in env]
    for item in items:
        index = next((i for i, old in enumerate(result) if old["name"] == item["name"]), None)
        if index is None:
            result.append(dict(item))
        else:
            result[index] = dict(item)
    return result


def procs_per_node(trainer: dict, resources: dict) -> str:
    """What the torch plugin puts in PET_NPROC_PER_NODE."""
    if trainer.get("numProcPerNode") is not None:
        return str(trainer["numProcPerNode"])
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    if any("gpu" in name and quantity(value) > 0 for name, value in amounts.items()):
        return "auto"
    cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu")
    return str(max(1, int(quantity(cpu)) if cpu is not None else 0))


def trainer_job(jobset_spec: dict) -> dict:
    """The replicated job the trainer runs in (labelled `trainjob-ancestor-step: trainer`)."""
    return next(job for job in jobset_spec["replicatedJobs"]
                if ((job.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL)
                == "trainer")


def apply_trainer(jobset_spec: dict, trainjob: dict, num_nodes: int, port: int) -> dict:
    """The trainer job's pod template after the TrainJob's trainer and the torch plugin (see the module docstring)."""
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer") or {}
    template = copy.deepcopy(trainer_job(jobset_spec)["template"]["spec"]["template"])
    container = next(c for c in template["spec"]["containers"] if c["name"] == "node")
    for field in ("image", "command", "args"):
        if trainer.get(field) is not None:
            container[field] = trainer[field]
    container["env"] = upsert_env(container.get("env") or [], trainer.get("env") or [])
    if trainer.get("resourcesPerNode"):
        container["resources"] = strategic_merge(container.get("resources") or {}, trainer["resourcesPerNode"])
    torch = [{"name": "PET_NNODES", "value": str(num_nodes)},
             {"name": "PET_NPROC_PER_NODE", "value": procs_per_node(trainer, container.get("resources") or {})},
             {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_PATH}}},
             {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
             {"name": "PET_MASTER_PORT", "value": str(port)}]
    container["env"] = upsert_env(container["env"], torch)
    return template
