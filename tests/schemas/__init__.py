"""The custom resource definitions the tests validate against, vendored here (README.md says from where).

`validator(plural_group)` turns a CRD's schema into a strict OAS 3.0 validator: `int-or-string` made
explicit, CEL rules dropped (a plain validator cannot run them), and unknown fields rejected
wherever the CRD does not preserve them, so a misspelled field fails a test instead of being pruned
silently by the API server. `problems(plural_group, obj)` lists what such a validator finds, in the
API server's words (the emulated server answers 422 with them, and prunes the unknown fields).

Kubeflow Trainer's CRDs are kept for two releases (`TRAINER_RELEASES`): v2.3's here, the next one's in its
own folder; `release=` picks one. `trainer_v24_problems` adds what v2.4 refuses beyond its CRD schema.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
# Kubeflow Trainer release -> its folder here ("" is this folder: v2.3.0). README.md says where each came from.
TRAINER_RELEASES = {"v2.3": "", "v2.4": "trainer-v2.4"}
# Trainer v2.4's breaking change the CRD schema does not carry: a runtime's replicated-job names are at most this
# long (JobSet derives pod and Service names from them, which must stay DNS labels).
MAX_REPLICATED_JOB_NAME = 20


def load_crd(plural_group: str, release: str = "") -> dict:
    """The vendored CRD named `<plural>.<group>` (e.g. `trainjobs.trainer.kubeflow.org`), of `release`'s folder."""
    return json.loads((HERE / release / f"{plural_group}.json").read_text())


def _strict(schema: Any) -> Any:
    """A CRD schema as OAS 3.0 for a validator: int-or-string made explicit, unknown fields rejected."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-validations")}
        if schema.pop("x-kubernetes-int-or-string", False):
            schema = {k: v for k, v in schema.items() if k not in ("type", "anyOf")}
            schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if "properties" in schema and not schema.pop("x-kubernetes-preserve-unknown-fields", False):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=None)
def validator(plural_group: str, release: str = "") -> Any:
    """A strict validator of the CRD's served version (metadata is left to the API server)."""
    from openapi_schema_validator import OAS30Validator

    crd = load_crd(plural_group, release)
    version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is checked by the API server
    return OAS30Validator(schema)


def problems(plural_group: str, obj: dict, release: str = "") -> list[str]:
    """Schema errors of `obj`, and `unknown field <path>` for each field the server would prune."""
    found = []
    for error in validator(plural_group, release).iter_errors(obj):
        path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path).replace(".[", "[")
        if error.validator == "additionalProperties":
            known = set((error.schema or {}).get("properties", {}))
            found += [f"unknown field {path + '.' if path else ''}{key}" for key in error.instance if key not in known]
        else:
            found.append(f"{path or '<root>'}: Invalid value: {error.message}")
    return found


def trainer_v24_problems(obj: dict) -> list[str]:
    """What Kubeflow Trainer v2.4 refuses in a runtime or a TrainJob's runtime patches beyond its CRD schema: a
    replicated-job name longer than `MAX_REPLICATED_JOB_NAME`."""
    spec = obj.get("spec") or {}
    named = [(f"spec.template.spec.replicatedJobs[{i}].name", job.get("name", ""))
             for i, job in enumerate(((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or [])]
    for p, patch in enumerate(spec.get("runtimePatches") or []):
        jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs") or []
        named += [(f"spec.runtimePatches[{p}].trainingRuntimeSpec.template.spec.replicatedJobs[{i}].name",
                   job.get("name", "")) for i, job in enumerate(jobs)]
    return [f"{path}: Invalid value: {name!r} is longer than {MAX_REPLICATED_JOB_NAME} characters"
            for path, name in named if len(name) > MAX_REPLICATED_JOB_NAME]
