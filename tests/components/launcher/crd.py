"""A strict validator for PyTorchJob manifests, from the CRD in `../shared/schemas/`."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

CRD = Path(__file__).parents[3].parent / "shared" / "schemas" / "kubeflow.org_pytorchjobs.yaml"


def _strict(schema):
    """The CRD schema as OAS 3.0 for a validator: int-or-string made explicit, unknown fields rejected."""
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


def pytorchjob_validator():
    from openapi_schema_validator import OAS30Validator

    crd = yaml.safe_load(CRD.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    schema = _strict(copy.deepcopy(schema))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is checked by the API server
    return OAS30Validator(schema)
