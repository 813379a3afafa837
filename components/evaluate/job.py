"""The body of `evaluate_model`: find the champion, write the evaluation config, launch its job, log the
metrics to MLflow, publish metrics and a report."""

from __future__ import annotations

import json
from typing import Any

from components.evaluate.mlflow_side import Champion, current_champion, log_evaluation
from components.launcher.component_io import cluster_options, default_job_root
from components.launcher.stage_job import run_stage_job
from components.reports.stage import table_cell
from trainer.errors import PipelineError
from trainer.storage import get_storage, join_uri


def evaluation_config(params: dict[str, Any], champion: Champion | None = None) -> dict:
    """The `python -m trainer evaluate` config from the component's inputs (and the champion to score too)."""
    reward_model = params.get("reward_model")
    if not params.get("reward_function") and reward_model is None:
        raise PipelineError("evaluate_model: give reward_function, reward_model or both")
    return {
        "model": {"path": params["model"].uri},
        "baseline_path": params["baseline"].uri,
        "champion_path": champion.source if champion is not None else None,
        "prompts_path": params["prompts"].uri,
        "reward": {"function": params.get("reward_function") or None,
                   "model_path": reward_model.uri if reward_model is not None else None},
        "generation": {"max_new_tokens": params["max_new_tokens"], "temperature": 0.0},
        "rollout": {"engine": params.get("rollout_engine") or "hf"},
        "environment": {"name": params["environment"]} if params.get("environment") else None,
    }


def run_evaluation_component(params: dict[str, Any]) -> float:
    metrics, report = params["metrics"], params["report"]
    job_root = params.get("job_root") or default_job_root(metrics.uri, params["run_id"], "evaluate")
    name = params.get("registered_model_name") or ""
    champion = current_champion(name) if name else None
    config = evaluation_config(params, champion)
    scores = run_stage_job("evaluate", config, model_uri=None, job_root=job_root, run_id=params["run_id"],
                           task="evaluate", cluster=cluster_options(params, config=config))
    if params.get("parent_run_id"):
        log_evaluation(parent_run_id=params["parent_run_id"], kfp_run_id=params["run_id"], scores=scores,
                       models={"candidate": params["model"].uri, "baseline": params["baseline"].uri},
                       champion=champion)
    if champion is not None:
        scores["champion_version"] = float(champion.version)  # the gate compares with this version's scores
    for key, value in scores.items():
        metrics.log_metric(key, float(value))
    with open(report.path, "w") as handle:
        handle.write(comparison_report(scores, job_root))
    headline = "reward" if "reward" in scores else "rm_score"
    return scores[headline] - scores[f"baseline_{headline}"]


def comparison_report(scores: dict[str, float], job_root: str) -> str:
    """Markdown: candidate vs baseline (and champion, when one was scored) per metric, then sample answers
    side by side."""
    names = [name for name in ("reward", "rm_score") if name in scores]
    champion = "champion_version" in scores
    title = f"# Candidate vs baseline and champion (version {scores['champion_version']:.0f})" if champion else \
        "# Candidate vs baseline"
    header = "| metric | candidate | baseline | difference |" + (" champion | difference |" if champion else "")
    lines = [title, "", header, "|---|---|---|---|" + ("---|---|" if champion else "")]
    for name in names:
        candidate, baseline = scores[name], scores[f"baseline_{name}"]
        row = f"| {name} | {candidate:.4f} | {baseline:.4f} | {candidate - baseline:+.4f} |"
        if champion:
            theirs = scores[f"champion_{name}"]
            row += f" {theirs:.4f} | {candidate - theirs:+.4f} |"
        lines.append(row)
    storage = get_storage(job_root)
    samples_uri = join_uri(job_root, "samples.jsonl")
    if storage.exists(samples_uri):
        rows = [json.loads(line) for line in storage.read_bytes(samples_uri).decode().splitlines() if line]
        others = ["baseline", "champion"] if champion else ["baseline"]
        lines += ["", "## Sample answers", "", "| prompt | candidate | score |" + "".join(f" {o} | score |"
                                                                                      for o in others),
                  "|---|---|---|" + "---|---|" * len(others)]
        lines += [f"| {table_cell(r['prompt'])} | {table_cell(r['response'])} | {r['score']:.3g} |"
                  + "".join(f" {table_cell(r.get(f'{o}_response', ''))} | {r.get(f'{o}_score', float('nan')):.3g} |"
                            for o in others)
                  for r in rows]
    return "\n".join(lines) + "\n"
