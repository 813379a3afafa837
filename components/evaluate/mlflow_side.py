"""The evaluation's MLflow side: which champion it scores, and the nested `evaluate` run its metrics go to.

The champion is the registered model's `champion` alias, resolved to the version's source (the
exported model directory, local or s3://) so the evaluation job scores it on the same held-out
prompts as the candidate and the baseline, and the gate compares live scores, not a score recorded
when the champion was registered (on other prompts, perhaps with another reward function).

The metrics are logged here, not by the gate, so they reach MLflow whatever the gate decides: a
run nested under the pipeline's parent run, tagged `alignflow.task=evaluate`, and `evaluation/*`
metrics on the parent run itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from components.lineage.lineage import KIND_TAG, PIPELINE_RUN_TAG, experiment_id, tracking_client
from trainer.errors import PipelineError
from trainer.storage import get_storage, join_uri

logger = logging.getLogger(__name__)

CHAMPION, TASK_TAG, TASK = "champion", "alignflow.task", "evaluate"


@dataclass(frozen=True, slots=True)
class Champion:
    """The registered model's current champion: its version and where its model files are."""

    name: str
    version: str
    source: str


def current_champion(name: str) -> Champion | None:
    """The version the alias `champion` of registered model `name` points at; None when there is none.

    Raises PipelineError when the version's model files are gone (no `config.json` at its source): the
    candidate cannot be compared with a champion that cannot be scored.
    """
    from mlflow.exceptions import MlflowException

    client = tracking_client()
    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None  # no such registered model yet, or no champion alias on it
        raise
    source = str(version.source).rstrip("/")
    if not get_storage(source).exists(join_uri(source, "config.json")):
        raise PipelineError(f"{name} version {version.version} (alias champion): no model at its source {source} "
                            f"(no config.json); restore the files, or move or delete the alias champion")
    return Champion(name=name, version=str(version.version), source=source)


def find_evaluate_run(client, experiment: str, parent_run_id: str) -> str | None:
    """The `evaluate` run an earlier attempt of this task nested under the parent run, if any."""
    runs = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent_run_id}' and "
                                            f"tags.`{TASK_TAG}` = '{TASK}'", max_results=1)
    return runs[0].info.run_id if runs else None


def log_evaluation(*, parent_run_id: str, kfp_run_id: str, scores: dict[str, float], models: dict[str, str],
                   champion: Champion | None, reasons: dict[str, str] | None = None) -> str:
    """Log the evaluation's metrics into the pipeline's lineage; returns the nested run's id.

    `models` maps a role (candidate, baseline) to the model URI scored; `reasons` the gate's sentence per reference
    (`baseline`, `champion`), tagged `alignflow.gate.<reference>` on both runs. A retried task logs into the
    run its earlier attempt opened.
    """
    from mlflow.entities import Metric, Param, RunTag

    client = tracking_client()
    experiment = experiment_id(client)
    run_id = find_evaluate_run(client, experiment, parent_run_id)
    if run_id is None:
        tags = {"mlflow.parentRunId": parent_run_id, TASK_TAG: TASK, KIND_TAG: "stage", "mlflow.runName": TASK,
                PIPELINE_RUN_TAG: kfp_run_id}
        run_id = client.create_run(experiment, tags={k: v for k, v in tags.items() if v}, run_name=TASK).info.run_id
        params = [Param(f"{role}_uri", uri) for role, uri in models.items() if uri]
        if champion is not None:
            params += [Param("champion_version", champion.version), Param("champion_uri", champion.source)]
        client.log_batch(run_id, params=params)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(key, float(value), now, 0) for key, value in scores.items()])
    client.log_batch(parent_run_id, metrics=[Metric(f"evaluation/{key}", float(value), now, 0)
                                             for key, value in scores.items()])
    tags = [RunTag(f"alignflow.gate.{reference}", reason) for reference, reason in (reasons or {}).items()]
    for target in (run_id, parent_run_id):
        client.log_batch(target, tags=tags)
    client.set_terminated(run_id)
    logger.info("evaluation metrics logged to MLflow run %s (nested under %s)", run_id, parent_run_id)
    return run_id
