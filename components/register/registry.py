"""The register component's work: a run holding the model artifact, and a registry version of it."""

from __future__ import annotations

import os


def register_directory(directory: str, name: str) -> str:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db")
    experiment = client.get_experiment_by_name("alignflow")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("alignflow")
    run = client.create_run(experiment_id, run_name=f"register-{name}")
    client.log_artifacts(run.info.run_id, directory, "model")
    client.set_terminated(run.info.run_id)
    try:
        client.create_registered_model(name)
    except MlflowException:
        pass  # registered before: add a version
    version = client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    return str(version.version)
