"""Kubeflow Trainer's model and dataset initializers for a stage: `spec.initializer` and the rewritten config.

Where the platform enables them (`training.initializers.enabled`, ALIGNFLOW_INITIALIZERS) and the job is a TrainJob,
a stage config whose `model.path` is `hf://`, `s3://` or `minio://` (KFP's artifacts under a MinIO pipeline root,
read as `s3://` of the same store), or whose `data.train_path`/`data.eval_path` is `s3://` or `minio://`, has
them fetched once, on CPU pods, by the runtime's `model-initializer` / `dataset-initializer` jobs into the shared
volume the nodes mount at /workspace; the config then names the copies there (Trainer's `ModelMountPath`
/workspace/model, `DatasetMountPath` /workspace/dataset). Trainer's JobSet builder gives each initializer container
`STORAGE_URI` from `spec.initializer.<step>.storageUri` and the step's `env`; the chart's runtime gives them the
S3 endpoint, region and credentials (the chart's S3 Secret's keys under the names the initializer reads), because
the Kubeflow SDK cannot set a step's `secretRef` and credentials never go into a manifest.

What the stock S3 initializer does with a URI, and so what the rewritten paths are: it downloads every key under the
URI as a prefix, each relative to it (a URI that is a whole key becomes its file name). So:
- the model is a folder: `s3://b/models/tiny` is fetched as `s3://b/models/tiny/` (the slash keeps
  `models/tiny-2/` out) into /workspace/model;
- a data file (`is_file`: an object of that exact key) lands at /workspace/dataset/<its name>, and a data folder
  (an HF `datasets` directory, or a Dataset artifact that is one) is /workspace/dataset itself;
- one URI per step: train and eval files in one folder are fetched as that folder (with whatever else lies in it);
  otherwise the initializer fetches `data.train_path` and the trainer reads `data.eval_path` from S3 itself.

Anything else is left alone: the trainer reads s3:// itself, which stays the fallback where the platform has no
initializers and for PyTorchJobs. hf:// is read by nothing but the model initializer (the trainer loads from local
paths or s3:// only, with no network at run time): `hf_problems` names every hf:// value a job cannot honour. An
hf:// dataset is refused everywhere: the HF dataset initializer writes a Hub snapshot, not a file the trainer reads.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Callable
from typing import Any

MODEL_MOUNT = "/workspace/model"
DATASET_MOUNT = "/workspace/dataset"
MODEL_SCHEMES = ("hf://", "s3://", "minio://")
DATA_KEYS = ("train_path", "eval_path")


def hf_problems(config: dict, *, model_fetched: bool, why_not: str = "") -> list[str]:
    """Every hf:// value of `config` the job cannot honour, naming its dotted key.

    Args:
        config: The stage config.
        model_fetched: Whether Trainer's model initializer fetches `model.path` (initializers on, a TrainJob).
        why_not: Why it does not (for the message), when it does not.
    """
    problems = []
    for key, value in _strings(config):
        if not value.startswith("hf://"):
            continue
        if key == "model.path":
            if not model_fetched:
                problems.append(f"model.path is {value!r}: an hf:// model is fetched only by Kubeflow Trainer's model "
                                f"initializer, and {why_not}; turn on the chart's training.initializers.enabled "
                                "(ALIGNFLOW_INITIALIZERS) on a Kubeflow Trainer cluster, or upload the model to S3")
        elif key.startswith("data."):
            problems.append(f"{key} is {value!r}: hf:// datasets are not read (the HF dataset initializer writes a "
                            "Hub snapshot, not the .jsonl/.parquet file or datasets directory the trainer reads); "
                            "upload the data to S3")
        else:
            problems.append(f"{key} is {value!r}: only model.path may be hf:// (fetched by Kubeflow Trainer's model "
                            "initializer); upload it to S3")
    return problems


def as_s3(uri: str) -> str:
    """`uri` as the S3 initializers read it: KFP's `minio://bucket/key` (artifacts under a MinIO pipeline root) is
    `s3://bucket/key` of the same store (the endpoint the initializers get is AWS_ENDPOINT_URL, MinIO's)."""
    return "s3://" + uri[len("minio://"):] if uri.startswith("minio://") else uri


def _strings(value: Any, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every string in a nested config."""
    if isinstance(value, dict):
        return [item for name, child in value.items() for item in _strings(child, f"{key}.{name}" if key else name)]
    if isinstance(value, list):
        return [item for index, child in enumerate(value) for item in _strings(child, f"{key}[{index}]")]
    return [(key, value)] if isinstance(value, str) else []


def _dataset_plan(paths: dict[str, str], is_file: Callable[[str], bool]) -> tuple[str, dict[str, str]]:
    """(storage URI, data key -> its path under /workspace/dataset) for the s3:// data paths (see the docstring)."""
    files = {key: path for key, path in paths.items() if is_file(path)}
    folders = {posixpath.dirname(path) for path in files.values()}
    if len(paths) == 2 and len(files) == 2 and len(folders) == 1:
        [folder] = folders
        return f"{folder}/", {key: posixpath.join(DATASET_MOUNT, posixpath.basename(path)) for key, path in files.items()}
    key = "train_path" if "train_path" in paths else "eval_path"
    path = paths[key]
    if key in files:
        return path, {key: posixpath.join(DATASET_MOUNT, posixpath.basename(path))}
    return path.rstrip("/") + "/", {key: DATASET_MOUNT}


def plan_initializers(config: dict, *, is_file: Callable[[str], bool], s3_env: dict[str, str] | None = None
                      ) -> tuple[dict, dict | None]:
    """(the stage config to write, the TrainJob's `spec.initializer`, or None when nothing is fetched).

    Args:
        config: The stage config; it is not changed.
        is_file: Whether an s3:// URI is an object of that exact key (else a folder).
        s3_env: The S3 initializers' plain environment (`ENDPOINT`, `REGION`); empty values are left out.
    """
    config = copy.deepcopy(config)
    s3_env = {name: value for name, value in (s3_env or {}).items() if value}
    initializer: dict = {}

    def step(uri: str) -> dict:
        entry: dict = {"storageUri": uri}
        if uri.startswith("s3://") and s3_env:
            entry["env"] = [{"name": name, "value": value} for name, value in s3_env.items()]
        return entry

    model = config.get("model") or {}
    path = model.get("path")
    if isinstance(path, str) and path.startswith(MODEL_SCHEMES):
        initializer["model"] = step(path if path.startswith("hf://") else as_s3(path).rstrip("/") + "/")
        model["path"] = MODEL_MOUNT
    data = config.get("data") or {}
    paths = {key: as_s3(data[key]) for key in DATA_KEYS
             if isinstance(data.get(key), str) and data[key].startswith(("s3://", "minio://"))}
    if paths:
        uri, rewritten = _dataset_plan(paths, is_file)
        initializer["dataset"] = step(uri)
        data.update(rewritten)
    return config, initializer or None


def sdk_initializer(initializer: dict) -> Any:
    """The Kubeflow SDK's `Initializer` for a `spec.initializer` of `plan_initializers`.

    An s3:// model is fetched whole (`ignore_patterns=None`): the SDK's default would leave out `*.bin` and `*.pt`,
    and a `pytorch_model.bin` is weights the trainer loads. An hf:// model keeps the SDK's default (the Hub
    initializer fetches only `*.json`, `*.safetensors`, `*.model` and `*.txt` anyway).
    """
    from kubeflow.trainer import (
        HuggingFaceModelInitializer,
        Initializer,
        S3DatasetInitializer,
        S3ModelInitializer,
    )

    def s3_fields(entry: dict) -> dict:
        env = {item["name"]: item["value"] for item in entry.get("env") or []}
        return {"storage_uri": entry["storageUri"], "endpoint": env.get("ENDPOINT"), "region": env.get("REGION")}

    model = dataset = None
    if "model" in initializer:
        entry = initializer["model"]
        model = (HuggingFaceModelInitializer(storage_uri=entry["storageUri"]) if entry["storageUri"].startswith("hf://")
                 else S3ModelInitializer(**s3_fields(entry), ignore_patterns=None))
    if "dataset" in initializer:
        dataset = S3DatasetInitializer(**s3_fields(initializer["dataset"]))
    return Initializer(model=model, dataset=dataset)
