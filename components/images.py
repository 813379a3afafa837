"""Image names the components run in (overridable at compile time through the environment)."""

import os

# The slim launcher image (kfp, kubernetes, boto3, mlflow client, this project without torch).
LAUNCHER_IMAGE = os.environ.get("ALIGNFLOW_LAUNCHER_IMAGE", "ghcr.io/alignflow/launcher:latest")
# The CUDA trainer image the PyTorchJobs run.
TRAINER_IMAGE = os.environ.get("ALIGNFLOW_TRAINER_IMAGE", "ghcr.io/alignflow/trainer:latest")
