"""Image names the components run in (overridable at compile time through the environment)."""

import os

# The slim launcher image (kfp, kubernetes, boto3, mlflow client, this project without torch).
LAUNCHER_IMAGE = os.environ.get("ALIGNFLOW_LAUNCHER_IMAGE", "ghcr.io/alignflow/launcher:latest")
# The CUDA trainer image the PyTorchJobs run.
# The published trainer image; a platform's own comes from ALIGNFLOW_TRAINER_IMAGE (the chart's ConfigMap).
PUBLISHED_TRAINER_IMAGE = "ghcr.io/alignflow/trainer:latest"
# Its vLLM variant (images/trainer/Dockerfile, VARIANT=vllm), for stages with `rollout.engine: vllm`.
PUBLISHED_TRAINER_VLLM_IMAGE = "ghcr.io/alignflow/trainer:latest-vllm"
TRAINER_IMAGE = os.environ.get("ALIGNFLOW_TRAINER_IMAGE", PUBLISHED_TRAINER_IMAGE)
