"""A strict validator for PyTorchJob manifests, from the CRD vendored in `tests/schemas/`."""

from __future__ import annotations

from tests.schemas import validator


def pytorchjob_validator():
    return validator("pytorchjobs.kubeflow.org")
