"""A retrain's parameters file: one file says what a retrain trains (the CI workflow and the chart's
recurring run both submit with it), plus the dataset manifest it names.

    # pipelines/retrain/params.yaml
    pipeline: rlhf-ppo            # which pipeline
    datasets: datasets.yaml       # the dataset manifest, relative to this file (optional)
    params:                       # pipeline parameters (anything `--param` takes)
      base_model_uri: s3://models/llama-3.2-1b
      ppo_episodes: 200

    # pipelines/retrain/datasets.yaml
    datasets:
      sft_train_uri:              # the pipeline parameter the URI goes to
        uri: s3://data/sft/2026-11-30.jsonl
        sha256: 9f2c...           # SHA-256 of the file's bytes

Each manifest entry becomes the URI parameter it names, and all their hashes go to the pipeline's
`dataset_sha256` parameter ({uri: sha256}): the run's first step (components/lineage) checks every
dataset against its hash, fails before training when one differs, and logs URIs and hashes to MLflow.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import PipelineError

FILE_KEYS = {"pipeline", "datasets", "params"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _load_mapping(path: Path, what: str) -> dict:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as err:
        raise PipelineError(f"{path}: cannot read the {what} ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise PipelineError(f"{where}: not valid YAML ({getattr(err, 'problem', err)})") from err
    if not isinstance(document, dict):
        raise PipelineError(f"{path}: expected a mapping with keys {sorted(FILE_KEYS)}, found {type(document).__name__}")
    return document


def load_manifest(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The URI parameters and the {uri: sha256} map of a dataset manifest."""
    document = _load_mapping(path, "dataset manifest")
    entries = document.get("datasets")
    if set(document) != {"datasets"} or not isinstance(entries, dict):
        raise PipelineError(f"{path}: expected one key `datasets` mapping parameter names to {{uri, sha256}}")
    uris, hashes = {}, {}
    for parameter, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != {"uri", "sha256"}:
            raise PipelineError(f"{path}: datasets.{parameter}: expected keys uri and sha256, found {entry!r}")
        uri, digest = str(entry["uri"]), str(entry["sha256"]).lower()
        if not SHA256.match(digest):
            raise PipelineError(f"{path}: datasets.{parameter}.sha256 is {entry['sha256']!r}, "
                                "expected 64 hex digits (sha256sum of the file)")
        if hashes.get(uri, digest) != digest:
            raise PipelineError(f"{path}: datasets.{parameter}: {uri} is listed twice with different hashes")
        uris[parameter], hashes[uri] = uri, digest
    return uris, hashes


def load_params_file(path: Path) -> tuple[str | None, dict[str, Any]]:
    """(pipeline name or None, pipeline parameters) from a parameters file and the manifest it names."""
    document = _load_mapping(path, "parameters file")
    unknown = set(document) - FILE_KEYS
    if unknown:
        raise PipelineError(f"{path}: unknown key(s) {sorted(unknown)}; expected {sorted(FILE_KEYS)}")
    params = document.get("params") or {}
    if not isinstance(params, dict):
        raise PipelineError(f"{path}: params is {type(params).__name__}, expected a mapping of parameter: value")
    pipeline = document.get("pipeline")
    if pipeline is not None and not isinstance(pipeline, str):
        raise PipelineError(f"{path}: pipeline is {pipeline!r}, expected a pipeline name such as rlhf-ppo")
    if document.get("datasets"):
        uris, hashes = load_manifest(path.parent / str(document["datasets"]))
        overlap = sorted(set(uris) & set(params))
        if overlap:
            raise PipelineError(f"{path}: {overlap} set both in params and in the dataset manifest; keep them in "
                                "the manifest only")
        params = {**params, **uris, "dataset_sha256": hashes}
    return pipeline, params
