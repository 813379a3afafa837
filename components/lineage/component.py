"""open_lineage and finish_run: one MLflow parent run per pipeline run, around all of its stages."""

from kfp import dsl

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def open_lineage(
    pipeline: str,
    pipeline_version: str,
    run_id: str,
    dataset_names: list,
    dataset_uris: list,
    base_model_uri: str = "",
    dataset_sha256: dict = {},
) -> str:
    """Open the pipeline run's MLflow parent run (the first step); every stage's run nests under it.

    Hashes each dataset (SHA-256 of its bytes) and fails before anything trains when one differs
    from `dataset_sha256` (the retrain's dataset manifest). The run is tagged with the KFP run id,
    the pipeline's name and version, and logs each dataset as an MLflow input (URI and hash). A
    retried task finds and reuses the run it opened before. Where KFP's own MLflow integration opened
    the pipeline's run (KFP 2.17: the task has KFP_MLFLOW_CONFIG), the lineage goes on that run and its
    id is returned: no second parent is opened.

    Args:
        pipeline: The pipeline's name (e.g. rlhf-dpo).
        pipeline_version: The pipeline's version (the alignflow package version it was compiled from).
        run_id: The KFP run id.
        dataset_names: Names of the datasets (e.g. sft_train), in the order of `dataset_uris`.
        dataset_uris: Dataset URIs (local, s3:// or minio://); empty strings are skipped.
        base_model_uri: The model the run starts from, logged as a param.
        dataset_sha256: Expected SHA-256 per dataset URI ({uri: hex}); URIs not listed are only hashed.

    Returns:
        The MLflow parent run id.
    """
    from components.lineage.lineage import open_pipeline_run

    return open_pipeline_run(pipeline=pipeline, version=pipeline_version, kfp_run_id=run_id,
                             datasets=dict(zip(dataset_names, dataset_uris)), expected=dataset_sha256,
                             base_model_uri=base_model_uri)


@dsl.component(base_image=LAUNCHER_IMAGE)
def finish_run(run_id: str, status: dsl.PipelineTaskFinalStatus, launcher_mode: str = "kubernetes") -> str:
    """The pipelines' exit handler: delete the run's training jobs, then close its MLflow parent run.

    Runs however the stages ended. The run's jobs (labelled alignflow/run, of every kind the run may
    have used) are deleted; the parent run is marked FINISHED, FAILED or KILLED after KFP's final state. An
    exit task may depend on no other task, so the parent run is found by its KFP run id tag. A run KFP's MLflow
    integration opened is left for KFP to close.

    Args:
        run_id: The KFP run id.
        status: How the pipeline's stages ended (set by KFP).
        launcher_mode: `kubernetes` deletes jobs in this pod's namespace; `local` has none to delete.

    Returns:
        The MLflow status written (FINISHED, FAILED or KILLED), or "" when no parent run was opened.
    """
    from components.lineage.lineage import close_pipeline_run, delete_run_jobs

    try:
        delete_run_jobs(run_id, launcher_mode)
    finally:
        closed = close_pipeline_run(run_id, status.state, status.error_message)
    return closed
