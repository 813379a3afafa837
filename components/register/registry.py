"""The registration gate's work: one registry version per candidate, tagged back to its pipeline run,
with the aliases `candidate` (every registration) and `champion` (when it beats the champion).

The model is logged once, here: `mlflow_model.write_mlflow_model` makes the candidate's exported
directory an MLflow model in place, and the version's source is that directory (no second copy).
The version's run is the candidate stage's MLflow run (below the pipeline's parent run), so
the registry, the stage run, the parent run and the KFP run point at each other.

Champion comparison: the evaluation job scored the champion live beside the candidate, on the same
prompts, and judged the candidate against it by the gate's own rule (`champion_gate/opens`: the lower
confidence bound of the paired gain clears the minimum effect and no guard falls; for version
`champion_version`; components/evaluate). Only when the alias moved to another version after the
evaluation (a concurrent run registered one) does the gate fall back to comparing the headline mean
(`rm_score` where a reward model was judged, else `reward`) with that version's `metric.<headline>` tag,
recorded at its registration, and the report says so (and whether the two were scored on the same
held-out prompts: their `dataset.eval_prompts.sha256` tags).

The evaluation's metrics reach MLflow from the evaluate step itself (a nested `evaluate` run and
`evaluation/*` on the parent run), whatever the gate decides; the version links to that run too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from components.lineage.lineage import (
    KIND_TAG,
    PIPELINE_RUN_TAG,
    PIPELINE_TAG,
    dataset_hashes,
    experiment_id,
    tracking_client,
)
from components.register.mlflow_model import registry_source, write_mlflow_model

logger = logging.getLogger(__name__)

CANDIDATE, CHAMPION = "candidate", "champion"
TASK_TAG = "alignflow.task"


@dataclass(kw_only=True, slots=True)
class Registration:
    """What the gate did, for its report."""

    name: str
    version: str
    headline: str
    scores: dict[str, float]
    is_champion: bool
    previous_champion: dict | None = None
    """The champion before this registration: version, its headline value, run id, scores, and `live` (scored
    in this run's evaluation, else its recorded scores); None when there was none."""
    same_eval_prompts: bool | None = None
    """Whether candidate and previous champion were scored on the same held-out prompts (None: unknown)."""
    stage_run_id: str = ""
    parent_run_id: str = ""
    experiment_id: str = ""
    model_source: str = ""
    tags: dict[str, str] = field(default_factory=dict)


def headline_metric(scores: dict[str, float]) -> str:
    """The metric the gate judges: the reward model's score where there was one, else the checkable reward."""
    return "rm_score" if "rm_score" in scores else "reward"


def find_stage_run(client, experiment: str, parent_run_id: str, stage: str) -> str | None:
    """The newest run of `stage` below the pipeline's parent run: nested in it, or deeper where KFP's MLflow
    integration put a run for the stage's task (and its groups) in between (components/lineage/kfp_mlflow.py)."""
    from components.lineage.kfp_mlflow import descends_from

    if not parent_run_id or not stage:
        return None
    runs = client.search_runs([experiment], f"tags.`{TASK_TAG}` = '{stage}'", order_by=["attributes.start_time DESC"],
                              max_results=50)
    return next((run.info.run_id for run in runs if descends_from(client, run.info.run_id, parent_run_id)), None)


def _registration_run(client, experiment: str, parent_run_id: str, kfp_run_id: str) -> str:
    """A `register` run nested under the parent, for a candidate whose stage run cannot be found."""
    tags = {"mlflow.runName": "register", TASK_TAG: "register", KIND_TAG: "stage"}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if kfp_run_id:
        tags[PIPELINE_RUN_TAG] = kfp_run_id
    run_id = client.create_run(experiment, tags=tags, run_name="register").info.run_id
    client.set_terminated(run_id)
    return run_id


def champion_scores(scores: dict[str, float], champion) -> tuple[dict[str, float | None], bool]:
    """The champion's scores to compare with, and whether they are live (scored in this run's evaluation).

    Live when the evaluation scored the version that is champion now; else the scores recorded (`metric.*`
    tags) when that version was registered.
    """
    evaluated = scores.get("champion_version")
    if evaluated is not None and str(int(evaluated)) == str(champion.version):
        return {key[len("champion_"):]: value for key, value in scores.items()
                if key.startswith("champion_") and key != "champion_version"}, True
    return {key[len("metric."):]: _float(value) for key, value in champion.tags.items()
            if key.startswith("metric.")}, False


def _current_champion(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def register_candidate(*, model_uri: str, name: str, scores: dict[str, float], stage: str = "",
                       parent_run_id: str = "", kfp_run_id: str = "", pipeline: str = "",
                       reasons: dict[str, str] | None = None) -> Registration:
    """Register the candidate model at `model_uri` as a new version of `name` and move the aliases.

    `reasons` holds the gate's sentence per reference (`baseline`, `champion`), tagged on the version as
    `alignflow.gate.<reference>`.
    """
    from mlflow.exceptions import MlflowException

    client = tracking_client()
    experiment = experiment_id(client)
    write_mlflow_model(model_uri, name)
    run_id = find_stage_run(client, experiment, parent_run_id, stage) or _registration_run(
        client, experiment, parent_run_id, kfp_run_id)
    try:
        client.create_registered_model(name, description="Trained and gated by alignflow pipelines.")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    headline = headline_metric(scores)
    eval_hashes = dataset_hashes(client, parent_run_id) if parent_run_id else {}
    evaluate_run = find_stage_run(client, experiment, parent_run_id, "evaluate")
    # The version's own scores (the champion's, scored beside it, are not this version's metrics).
    own = {key: value for key, value in scores.items() if not key.startswith("champion_")}
    tags = {PIPELINE_RUN_TAG: kfp_run_id, PIPELINE_TAG: pipeline, TASK_TAG: stage, "alignflow.parent_run_id":
            parent_run_id, "alignflow.headline_metric": headline, "alignflow.evaluation_run_id": evaluate_run,
            **{f"metric.{key}": repr(float(value)) for key, value in own.items()},
            **{f"dataset.{key}.sha256": value for key, value in eval_hashes.items()},
            **{f"alignflow.gate.{reference}": reason for reference, reason in (reasons or {}).items()}}
    tags = {key: value for key, value in tags.items() if value}
    champion = _current_champion(client, name)
    source = registry_source(model_uri.rstrip("/"))
    version = client.create_model_version(name, source, run_id=run_id, tags=tags,
                                          description=f"{pipeline or 'alignflow'} run {kfp_run_id}: {stage}")
    client.set_registered_model_alias(name, CANDIDATE, version.version)
    registration = Registration(name=name, version=str(version.version), headline=headline, scores=own,
                                is_champion=True, stage_run_id=run_id, parent_run_id=parent_run_id,
                                experiment_id=experiment, model_source=source, tags=tags)
    if champion is not None:
        theirs, live = champion_scores(scores, champion)
        previous = theirs.get(headline)
        registration.previous_champion = {"version": str(champion.version), "value": previous,
                                          "run_id": champion.run_id, "scores": theirs, "live": live}
        if live:
            registration.same_eval_prompts = True  # scored in the same job, on the same prompts
        else:
            recorded, ours = champion.tags.get("dataset.eval_prompts.sha256"), tags.get("dataset.eval_prompts.sha256")
            registration.same_eval_prompts = (recorded == ours) if recorded and ours else None
        if live and "champion_gate/opens" in scores:  # judged in this run's evaluation, prompt by prompt
            registration.is_champion = scores["champion_gate/opens"] == 1.0
        else:
            registration.is_champion = previous is None or float(scores[headline]) > previous
        client.set_model_version_tag(name, version.version, "alignflow.compared_with",
                                     f"champion version {champion.version} "
                                     f"({'scored in this evaluation' if live else 'recorded score'})")
    if registration.is_champion:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    client.set_model_version_tag(name, version.version, "alignflow.champion", str(registration.is_champion).lower())
    for target in filter(None, {run_id, parent_run_id}):
        client.set_tag(target, "alignflow.registered_model", f"{name}/{version.version}")
        client.set_tag(target, "alignflow.model_uri", source)
    if parent_run_id:
        client.set_tag(parent_run_id, "alignflow.champion", str(registration.is_champion).lower())
    logger.info("registered %s version %s (%s); champion: %s", name, version.version, source, registration.is_champion)
    return registration


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
