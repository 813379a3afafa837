"""The custom resource definitions the tests validate against, vendored here (README.md says from where).

`validator(plural_group)` turns a CRD's schema into a strict OAS 3.0 validator: `int-or-string` made
explicit, CEL rules dropped (a plain validator cannot run them), and unknown fields rejected
wherever the CRD does not preserve them, so a misspelled field fails a test instead of being pruned
silently by the API server. `problems(plural_group, obj)` lists what such a validator finds, in the
API server's words (the emulated server answers 422 with them, and prunes the unknown fields).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def load_crd(plural_group: str) -> dict:
    """The vendored CRD named `<plural>.<group>` (e.g. `trainjobs.trainer.kubeflow.org`)."""
    return json.loads((HERE / f"{plural_group}.json").read_text())


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
def validator(plural_group: str) -> Any:
    """A strict validator of the CRD's served version (metadata is left to the API server)."""
    from openapi_schema_validator import OAS30Validator

    crd = load_crd(plural_group)
    version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is checked by the API server
    return OAS30Validator(schema)


def problems(plural_group: str, obj: dict) -> list[str]:
    """Schema errors of `obj`, and `unknown field <path>` for each field the server would prune."""
    found = []
    for error in validator(plural_group).iter_errors(obj):
        path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path).replace(".[", "[")
        if error.validator == "additionalProperties":
            known = set((error.schema or {}).get("properties", {}))
            found += [f"unknown field {path + '.' if path else ''}{key}" for key in error.instance if key not in known]
        else:
            found.append(f"{path or '<root>'}: Invalid value: {error.message}")
    return found
