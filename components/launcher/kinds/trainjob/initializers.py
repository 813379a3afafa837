"""Kubeflow Trainer's model and dataset initializers for a stage: `spec.initializer` and the rewritten config.

Where the platform enables them (`training.initializers.enabled`, ALIGNFLOW_INITIALIZERS), a TrainJob whose stage
config reads `model.path` from `hf://` or `s3://`, or `data.train_path`/`data.eval_path` from `s3://`, has them
fetched once by the runtime's `model-initializer` / `dataset-initializer` jobs (Trainer's JobSet builder sets
`STORAGE_URI` from `spec.initializer.<step>.storageUri`, merges `env`, and adds `secretRef` as `envFrom`) into the
shared volume the nodes mount at /workspace; the config then names the copies there (Trainer's
`ModelMountPath` /workspace/model, `DatasetMountPath` /workspace/dataset). Anything else is left alone: the trainer
reads s3:// itself, which stays the fallback where the platform has no initializers.

The stock S3 initializer downloads every key under the URI as a prefix, relative to it (a URI that is a whole key
becomes its file name), so one dataset URI covers both files when they share a folder.
"""

from __future__ import annotations

import copy
import posixpath

MODEL_MOUNT = "/workspace/model"
DATASET_MOUNT = "/workspace/dataset"
MODEL_SCHEMES = ("hf://", "s3://")
DATA_SCHEMES = ("s3://",)  # the HF dataset initializer writes a repo snapshot, not what `data.*` reads
DATA_KEYS = ("train_path", "eval_path")


def _dataset_plan(paths: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """(storage URI, key -> path under /workspace/dataset), or None when the paths cannot share one URI."""
    buckets = {path[len("s3://"):].split("/", 1)[0] for path in paths.values()}
    if len(buckets) != 1:
        return None
    if len(paths) == 1:
        [(key, path)] = paths.items()
        return path, {key: posixpath.join(DATASET_MOUNT, posixpath.basename(path.rstrip("/")))
                      if not path.endswith("/") else DATASET_MOUNT}
    folder = posixpath.commonpath([path[len("s3://"):] for path in paths.values()])
    if "/" not in folder and folder in buckets:  # the bucket's root: every key of it would be fetched
        return None
    uri = f"s3://{folder}"
    return uri, {key: posixpath.join(DATASET_MOUNT, posixpath.relpath(path[len("s3://"):], folder))
                 for key, path in paths.items()}


def plan_initializers(config: dict, *, s3_secret: str = "", s3_env: dict[str, str] | None = None
                      ) -> tuple[dict, dict | None]:
    """(the stage config to write, the TrainJob's `spec.initializer` or None when nothing is fetched)."""
    config = copy.deepcopy(config)
    s3_env = {name: value for name, value in (s3_env or {}).items() if value}
    initializer: dict = {}

    def step(uri: str) -> dict:
        entry: dict = {"storageUri": uri}
        if uri.startswith("s3://"):
            env = [{"name": name, "value": value} for name, value in s3_env.items()]
            if env:
                entry["env"] = env
            if s3_secret:  # ACCESS_KEY_ID / SECRET_ACCESS_KEY keys, as the initializer reads them (envFrom)
                entry["secretRef"] = {"name": s3_secret}
        return entry

    model = config.get("model") or {}
    path = model.get("path")
    if isinstance(path, str) and path.startswith(MODEL_SCHEMES):
        initializer["model"] = step(path.rstrip("/"))
        model["path"] = MODEL_MOUNT
    data = config.get("data") or {}
    paths = {key: data[key] for key in DATA_KEYS if isinstance(data.get(key), str) and data[key].startswith(DATA_SCHEMES)}
    plan = _dataset_plan(paths) if paths else None
    if plan is not None:
        uri, rewritten = plan
        initializer["dataset"] = step(uri)
        data.update(rewritten)
    return config, initializer or None
