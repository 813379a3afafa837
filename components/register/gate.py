"""The body of `register_model`: read the evaluation, register, write the side-by-side report."""

from __future__ import annotations

import os
from typing import Any

from components.evaluate.job import read_gate
from components.register.registry import register_candidate
from components.reports.comparison import comparison_html
from components.reports.curves import read_jsonl
from components.stage_io import default_job_root
from trainer.storage import join_uri


def evaluation_samples(evaluation_uri: str, kfp_run_id: str) -> list[dict]:
    """The evaluation job's side-by-side samples (`samples.jsonl` in its job root, found as evaluate_model
    finds it: beside its metrics artifact)."""
    return read_jsonl(join_uri(default_job_root(evaluation_uri, kfp_run_id, "evaluate"), "samples.jsonl"))


def evaluation_reasons(evaluation_uri: str, kfp_run_id: str) -> dict[str, str]:
    """The gate's sentence per reference, from the evaluation job's `gate.json` (found as the samples are)."""
    gate = read_gate(default_job_root(evaluation_uri, kfp_run_id, "evaluate"))
    return {reference: decision["reason"] for reference, decision in gate.items()}


def run_gate(model: Any, evaluation: Any, comparison: Any, *, name: str, parent_run_id: str, kfp_run_id: str,
             pipeline: str) -> str:
    scores = {key: float(value) for key, value in (evaluation.metadata or {}).items()
              if isinstance(value, (int, float)) and not isinstance(value, bool)}
    registration = register_candidate(model_uri=model.uri, name=name, scores=scores,
                                      stage=str((model.metadata or {}).get("stage", "")),
                                      parent_run_id=parent_run_id, kfp_run_id=kfp_run_id, pipeline=pipeline,
                                      reasons=evaluation_reasons(evaluation.uri, kfp_run_id))
    samples = evaluation_samples(evaluation.uri, kfp_run_id)
    with open(comparison.path, "w") as handle:
        handle.write(comparison_html(registration, samples, os.environ.get("MLFLOW_TRACKING_URI", "")))
    comparison.metadata["version"] = registration.version
    comparison.metadata["champion"] = registration.is_champion
    return registration.version
