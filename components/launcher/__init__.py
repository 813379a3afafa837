"""The PyTorchJob launcher: build the manifest from a stage spec, run it on Kubernetes or locally."""

from components.launcher.manifest import JobSpec, SecretEnv, build_pytorchjob, derive_job_name

__all__ = ["JobSpec", "SecretEnv", "build_pytorchjob", "derive_job_name"]
