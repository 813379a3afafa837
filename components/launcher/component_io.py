"""Turning a training component's KFP inputs into a stage config and its results into KFP outputs."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from components.launcher.stage_job import ClusterOptions, run_stage_job, stage_report

# Component parameter -> dotted config key, for the parameters every training component shares.
COMMON_KEYS = {"lr": "optimizer.lr", "max_epochs": "train.max_epochs", "micro_batch_size": "train.micro_batch_size",
               "max_length": "data.max_length"}
STAGE_KEYS = {"dpo": {"beta": "dpo.beta", "loss_type": "dpo.loss_type"}}


def set_dotted(config: dict, key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    for section in sections:
        config = config.setdefault(section, {})
    config[leaf] = value


def stage_config(stage: str, params: dict[str, Any]) -> dict:
    """The stage config from a component's inputs; `settings` ({"dotted.key": value}) wins."""
    config: dict = {"model": {"path": params["base_model"].uri},
                    "data": {"train_path": params["train_dataset"].uri, "eval_path": params["eval_dataset"].uri}}
    for name, key in {**COMMON_KEYS, **STAGE_KEYS.get(stage, {})}.items():
        set_dotted(config, key, params[name])
    for key, value in (params.get("settings") or {}).items():
        set_dotted(config, key, value)
    return config


def cluster_options(params: dict[str, Any]) -> ClusterOptions:
    # The tracking server the pipeline was given reaches the job as plain environment.
    env = {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "ALIGNFLOW_PARENT_RUN_ID")
           if os.environ.get(k)}
    gpus = params["gpus_per_node"]
    return ClusterOptions(mode=params["launcher_mode"], image=params["trainer_image"], num_nodes=params["num_nodes"],
                          nproc_per_node=max(gpus, 1), gpus_per_node=gpus, s3_secret=params["s3_secret"], env=env)


def run_training_component(stage: str, params: dict[str, Any]) -> dict[str, float]:
    """Run the stage's job and publish its Model, Metrics and Markdown report."""
    model, metrics, report = params["model"], params["metrics"], params["report"]
    job_root = params.get("job_root") or posixpath.join(posixpath.dirname(model.uri.rstrip("/")), "job")
    config = stage_config(stage, params)
    final = run_stage_job(stage, config, model_uri=model.uri, job_root=job_root, run_id=params["run_id"],
                          task=f"{stage}", cluster=cluster_options(params))
    for key, value in final.items():
        if isinstance(value, (int, float)):
            metrics.log_metric(key.replace("/", "_"), float(value))
    model.metadata["stage"] = stage
    with open(report.path, "w") as handle:
        handle.write(stage_report(stage, config, final, job_root))
    return final
