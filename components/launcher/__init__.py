"""The launcher: build a stage's job (a PyTorchJob or a TrainJob), run it on Kubernetes or locally."""

from components.launcher.manifest import JobSpec, SecretEnv, build_pytorchjob, derive_job_name

__all__ = ["JobSpec", "SecretEnv", "build_pytorchjob", "derive_job_name"]
