"""The body of `evaluate_model`: find the champion, write the evaluation config, launch its job, log the
metrics to MLflow, publish metrics and a report."""

from __future__ import annotations

import json
from typing import Any

from components.evaluate.mlflow_side import Champion, current_champion, log_evaluation
from components.launcher.stage_job import run_stage_job
from components.reports.stage import table_cell
from components.stage_io import cluster_options, default_job_root
from trainer.errors import PipelineError
from trainer.storage import get_storage, join_uri


def evaluation_config(params: dict[str, Any], champion: Champion | None = None) -> dict:
    """The `python -m trainer evaluate` config from the component's inputs (and the champion to score too).

    With an `environment`, the episodes run as the candidate's stage trained on them: its `environment`
    section (turns, tools, token budget, ...) and its stop tokens, which the stage left in the model's metadata.
    """
    reward_model = params.get("reward_model")
    if not params.get("reward_function") and reward_model is None:
        raise PipelineError("evaluate_model: give reward_function, reward_model or both")
    trained = params["model"].metadata or {}
    generation = {"max_new_tokens": params["max_new_tokens"], "temperature": params.get("temperature", 0.0)}
    environment = None
    if params.get("environment"):
        environment = {**(trained.get("environment") or {}), "name": params["environment"]}
        if trained.get("generation_stop"):
            generation["stop"] = list(trained["generation_stop"])
    return {
        "model": {"path": params["model"].uri},
        "baseline_path": params["baseline"].uri,
        "champion_path": champion.source if champion is not None else None,
        "prompts_path": params["prompts"].uri,
        "reward": {"function": params.get("reward_function") or None,
                   "model_path": reward_model.uri if reward_model is not None else None},
        "generation": generation,
        "samples_per_prompt": params.get("samples_per_prompt", 1),
        "rollout": {"engine": params.get("rollout_engine") or "hf"},
        "environment": environment,
        "gate": {key: params[f"gate_{key}"] for key in ("confidence", "min_effect", "guard_tolerance")
                 if f"gate_{key}" in params},
    }


def read_gate(job_root: str) -> dict[str, dict]:
    """The evaluation job's gate decisions by reference (`baseline`, `champion`): `opens`, `reason`, `metric`,
    `metrics`; empty when the job wrote none."""
    uri = join_uri(job_root, "gate.json")
    storage = get_storage(uri)
    return json.loads(storage.read_bytes(uri)) if storage.exists(uri) else {}


def run_evaluation_component(params: dict[str, Any]) -> str:
    metrics, report = params["metrics"], params["report"]
    job_root = params.get("job_root") or default_job_root(metrics.uri, params["run_id"], "evaluate")
    name = params.get("registered_model_name") or ""
    champion = current_champion(name) if name else None
    config = evaluation_config(params, champion)
    scores = run_stage_job("evaluate", config, model_uri=None, job_root=job_root, run_id=params["run_id"],
                           task="evaluate", cluster=cluster_options(params, config=config))
    gate = read_gate(job_root)
    if "baseline" not in gate:
        raise PipelineError(f"evaluate_model: the evaluation job left no gate decision in {job_root}/gate.json")
    if params.get("parent_run_id"):
        log_evaluation(parent_run_id=params["parent_run_id"], kfp_run_id=params["run_id"], scores=scores,
                       models={"candidate": params["model"].uri, "baseline": params["baseline"].uri},
                       champion=champion, reasons={reference: d["reason"] for reference, d in gate.items()})
    if champion is not None:
        scores["champion_version"] = float(champion.version)  # the gate compares with this version's scores
    for key, value in scores.items():
        metrics.log_metric(key, float(value))
    with open(report.path, "w") as handle:
        handle.write(comparison_report(scores, job_root, gate))
    return "register" if gate["baseline"]["opens"] else "refuse"


def comparison_report(scores: dict[str, float], job_root: str, gate: dict[str, dict]) -> str:
    """Markdown: the gate's decisions, candidate vs baseline (and champion, when one was scored) per metric, then
    sample answers side by side."""
    names = [name for name in ("reward", "rm_score") if name in scores]
    champion = "champion_version" in scores
    title = f"# Candidate vs baseline and champion (version {scores['champion_version']:.0f})" if champion else \
        "# Candidate vs baseline"
    lines = [title, "", *gate_section(gate), ""]
    header = "| metric | candidate | baseline | difference |" + (" champion | difference |" if champion else "")
    lines += ["## Means", "", header, "|---|---|---|---|" + ("---|---|" if champion else "")]
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


def gate_section(gate: dict[str, dict]) -> list[str]:
    """The gate's table: per reference and metric, the paired difference, its lower bound and the bar it had to
    clear (the minimum effect for the judged metric, minus the tolerance for a guard)."""
    lines = ["## The gate", "", "| against | metric | n | difference | lower bound | must reach | verdict |",
             "|---|---|---|---|---|---|---|"]
    for reference, decision in gate.items():
        numbers = decision["metrics"]
        prefix = "gate" if reference == "baseline" else f"{reference}_gate"
        confidence = numbers[f"{prefix}/confidence"]
        lines.append(f"| {reference} | {decision['metric']} | {numbers[f'{prefix}/n']:.0f} | "
                     f"{numbers[f'{prefix}/difference']:+.4f} | {numbers[f'{prefix}/lower_bound']:+.4f} | "
                     f"{numbers[f'{prefix}/min_effect']:+.4f} | {'opens' if decision['opens'] else 'refused'} |")
        guards = sorted({key.split("/")[2] for key in numbers if key.startswith(f"{prefix}/guard/")})
        for metric in guards:
            key = f"{prefix}/guard/{metric}"
            lines.append(f"| {reference} | guard: {metric} | | {numbers[f'{key}/difference']:+.4f} | "
                         f"{numbers[f'{key}/lower_bound']:+.4f} | {-numbers[f'{key}/tolerance']:+.4f} | "
                         f"{'holds' if numbers[f'{key}/holds'] else 'falls'} |")
    lines += ["", f"Lower bounds are one-sided at {confidence:.0%} confidence, paired prompt by prompt "
                  "(docs/pipelines.md, \"The gate\")."]
    lines += [f"- {reference}: {decision['reason']}" for reference, decision in gate.items()]
    return lines
