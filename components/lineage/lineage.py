"""The lineage components' work: hash the datasets, open (or find) the parent run, close it.

MLflow is imported inside the functions (it costs seconds), from the MLflow client the launcher image
carries. Tags every alignflow run shares: `alignflow.pipeline_run_id` (the KFP run id) and
`alignflow.kind` (`pipeline` here; stage runs are nested under this one through `mlflow.parentRunId`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from trainer.errors import PipelineError, StorageError
from trainer.storage import get_storage, is_remote

logger = logging.getLogger(__name__)

EXPERIMENT = "alignflow"
KIND_TAG, PIPELINE_RUN_TAG = "alignflow.kind", "alignflow.pipeline_run_id"
PIPELINE_TAG, VERSION_TAG = "alignflow.pipeline", "alignflow.pipeline_version"
# KFP's final states (PipelineTaskFinalStatus.state) -> MLflow run status.
FINAL_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELED": "KILLED", "CANCELLED": "KILLED"}
EVAL_NAMES = ("eval", "held_out")


def tracking_client():
    """An MlflowClient on KFP's MLflow server, authenticated as KFP's own calls are, where KFP's MLflow integration
    is on (kfp_mlflow.py); else on MLFLOW_TRACKING_URI (MLflow's own default, `sqlite:///mlflow.db`, without one)."""
    from mlflow import MlflowClient

    from components.lineage.kfp_mlflow import read_kfp_mlflow, use_kfp_mlflow_auth

    kfp = read_kfp_mlflow()
    if kfp is not None:
        use_kfp_mlflow_auth(kfp)
        return MlflowClient(tracking_uri=kfp.endpoint)
    return MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db")


def experiment_id(client) -> str:
    """The experiment stage runs use too: KFP's where its MLflow integration is on, else MLFLOW_EXPERIMENT_ID,
    MLFLOW_EXPERIMENT_NAME, else `alignflow`."""
    from components.lineage.kfp_mlflow import read_kfp_mlflow

    kfp = read_kfp_mlflow()
    if kfp is not None:
        return kfp.experiment_id
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    from trainer.tracking.experiment import get_or_create_experiment

    return get_or_create_experiment(client, os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT)


def sha256_of(uri: str) -> tuple[str, int]:
    """SHA-256 (hex) and size in bytes of the file at `uri`, read in 1 MiB blocks (a remote file is
    downloaded to a temporary file first). Raises PipelineError naming the URI."""
    try:
        storage = get_storage(uri)
        if not storage.exists(uri):
            raise PipelineError(f"{uri}: dataset not found (expected a .jsonl or .parquet file)")
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(uri)
            if is_remote(uri):
                path = Path(scratch) / "data"
                storage.download_file(uri, path)
            digest, size = hashlib.sha256(), 0
            with path.open("rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
                    size += len(block)
    except (StorageError, OSError) as err:
        raise PipelineError(f"{uri}: cannot read the dataset to hash it: {err}") from err
    return digest.hexdigest(), size


def hash_datasets(datasets: dict[str, str], expected: dict[str, str]) -> dict[str, dict]:
    """{name: {uri, sha256, bytes}} of the given (non-empty) dataset URIs, each checked against `expected`."""
    hashed = {}
    for name, uri in datasets.items():
        if not uri:
            continue
        digest, size = sha256_of(uri)
        want = expected.get(uri)
        if want and want.lower() != digest:
            raise PipelineError(f"{uri}: content SHA-256 is {digest}, but the dataset manifest expects {want}; the "
                                f"data changed after the manifest was written (update the manifest, or restore the "
                                f"data)")
        hashed[name] = {"uri": uri, "sha256": digest, "bytes": size}
    unknown = sorted(set(expected) - {entry["uri"] for entry in hashed.values()})
    if unknown:
        raise PipelineError(f"dataset_sha256 names {unknown}, which no dataset parameter of this run points at")
    return hashed


def _dataset_inputs(hashed: dict[str, dict]) -> list:
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for name, entry in hashed.items():
        uri = entry["uri"]
        context = "eval" if any(word in name for word in EVAL_NAMES) else "train"
        dataset = Dataset(name=name, digest=entry["sha256"][:32], source_type="s3" if is_remote(uri) else "local",
                          source=json.dumps({"uri": uri}),
                          profile=json.dumps({"sha256": entry["sha256"], "bytes": entry["bytes"]}))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    return inputs


def find_pipeline_run(client, experiment: str, kfp_run_id: str) -> str | None:
    """The parent run an earlier attempt of this KFP run opened, if any."""
    runs = client.search_runs([experiment], f"tags.`{PIPELINE_RUN_TAG}` = '{kfp_run_id}' and "
                                            f"tags.`{KIND_TAG}` = 'pipeline'", max_results=1)
    return runs[0].info.run_id if runs else None


def _log_lineage(client, run_id: str, *, pipeline: str, version: str, base_model_uri: str,
                 hashed: dict[str, dict]) -> None:
    """The pipeline's params and its datasets as MLflow inputs, on the pipeline's run."""
    from mlflow.entities import Param

    params = [Param("pipeline", pipeline), Param("pipeline_version", version)]
    if base_model_uri:
        params.append(Param("base_model_uri", base_model_uri))
    client.log_batch(run_id, params=params)
    if hashed:
        client.log_inputs(run_id, datasets=_dataset_inputs(hashed))


def _tag_kfp_pipeline_run(client, run_id: str, *, pipeline: str, version: str, kfp_run_id: str,
                          base_model_uri: str, hashed: dict[str, dict]) -> str:
    """KFP's MLflow integration opened the pipeline's run `run_id`: put the lineage on it (a retried task again:
    tags and unchanged params are idempotent, inputs are logged once) and return its id; no second parent."""
    is_tagged = client.get_run(run_id).data.tags.get(KIND_TAG) == "pipeline"
    for key, value in {KIND_TAG: "pipeline", PIPELINE_RUN_TAG: kfp_run_id, PIPELINE_TAG: pipeline,
                       VERSION_TAG: version}.items():
        client.set_tag(run_id, key, value)
    if not is_tagged:
        _log_lineage(client, run_id, pipeline=pipeline, version=version, base_model_uri=base_model_uri, hashed=hashed)
    logger.info("lineage of %s run %s on KFP's MLflow run %s", pipeline, kfp_run_id, run_id)
    return run_id


def open_pipeline_run(*, pipeline: str, version: str, kfp_run_id: str, datasets: dict[str, str],
                      expected: dict[str, str], base_model_uri: str = "") -> str:
    """Check and hash the datasets, then open the parent run (or reuse a retried task's); return its id.

    Where KFP's MLflow integration opened the pipeline's run (`kfp_mlflow.py`), the lineage goes on that run
    and its id is returned instead.
    """
    from components.lineage.kfp_mlflow import read_kfp_mlflow

    hashed = hash_datasets(datasets, expected or {})  # fails before anything is written
    kfp = read_kfp_mlflow()
    client = tracking_client()
    if kfp is not None:
        return _tag_kfp_pipeline_run(client, kfp.pipeline_run_id, pipeline=pipeline, version=version,
                                     kfp_run_id=kfp_run_id, base_model_uri=base_model_uri, hashed=hashed)
    experiment = experiment_id(client)
    run_id = find_pipeline_run(client, experiment, kfp_run_id)
    if run_id is None:
        tags = {KIND_TAG: "pipeline", PIPELINE_RUN_TAG: kfp_run_id, PIPELINE_TAG: pipeline, VERSION_TAG: version,
                "mlflow.runName": f"{pipeline} {kfp_run_id[:8]}"}
        run_id = client.create_run(experiment, tags=tags, run_name=tags["mlflow.runName"]).info.run_id
        _log_lineage(client, run_id, pipeline=pipeline, version=version, base_model_uri=base_model_uri, hashed=hashed)
        logger.info("opened MLflow run %s for %s run %s", run_id, pipeline, kfp_run_id)
    else:
        client.update_run(run_id, status="RUNNING")
        logger.info("continuing MLflow run %s opened by an earlier attempt", run_id)
    return run_id


def delete_run_jobs(kfp_run_id: str, launcher_mode: str) -> list[str]:
    """Delete the run's jobs (PyTorchJobs or TrainJobs labelled alignflow/run) in this pod's namespace, of
    every kind the platform's setting allows; `local` mode has none (the local launcher stops its processes itself)."""
    if launcher_mode != "kubernetes":
        return []
    from components.launcher.follow.launcher import delete_run_jobs as delete_jobs
    from components.launcher.settings.options import current_namespace
    from components.launcher.settings.platform import PlatformDefaults
    from components.launcher.stage_job import run_label

    deleted = delete_jobs(current_namespace(), run_label(kfp_run_id), PlatformDefaults.from_environment().job_kind)
    logger.info("deleted %d job(s): %s", len(deleted), ", ".join(deleted) or "-")
    return deleted


def close_pipeline_run(kfp_run_id: str, kfp_state: str, error_message: str = "") -> str:
    """Mark the KFP run's parent run with the MLflow status matching KFP's final state; returns that
    status, or "" when the run never opened one (its first step failed). A run KFP's MLflow integration opened
    only gets the error, if any: KFP's API server closes it when the pipeline run ends."""
    from components.lineage.kfp_mlflow import read_kfp_mlflow

    status = FINAL_STATUS.get(str(kfp_state).upper(), "FAILED")
    kfp = read_kfp_mlflow()
    client = tracking_client()
    run_id = kfp.pipeline_run_id if kfp is not None else find_pipeline_run(client, experiment_id(client), kfp_run_id)
    if run_id is None:
        logger.warning("no MLflow parent run is tagged with KFP run %s; nothing to close", kfp_run_id)
        return ""
    if error_message:
        client.set_tag(run_id, "alignflow.error", error_message[:5000])
    if kfp is not None:
        logger.info("MLflow run %s belongs to KFP's MLflow integration, which closes it (%s)", run_id, status)
        return status
    client.set_terminated(run_id, status=status)
    return status


def dataset_hashes(client, run_id: str) -> dict[str, str]:
    """{dataset name: sha256} the parent run logged as inputs."""
    hashes = {}
    for dataset_input in client.get_run(run_id).inputs.dataset_inputs:
        profile = json.loads(dataset_input.dataset.profile or "{}")
        hashes[dataset_input.dataset.name] = profile.get("sha256", dataset_input.dataset.digest)
    return hashes
