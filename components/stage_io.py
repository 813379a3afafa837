"""Turning a training component's KFP inputs into a stage config and its results into KFP outputs."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from components.images import PUBLISHED_TRAINER_IMAGE, PUBLISHED_TRAINER_VLLM_IMAGE
from components.launcher.settings.options import COMPONENT, RUN, options_set_by
from components.launcher.settings.platform import PlatformDefaults
from components.launcher.settings.scheduling import scheduling_overrides
from components.launcher.stage_job import ClusterOptions, run_stage_job
from components.reports.stage import stage_report

# The trainer image the components name by default; a platform's own image (ALIGNFLOW_TRAINER_IMAGE) wins over it.

# Component parameter -> dotted config key, for the parameters the training components share; the field also
# describes the parameter in the IR (components/parameters.py).
COMMON_KEYS = {"lr": "optimizer.lr", "micro_batch_size": "train.micro_batch_size", "max_length": "data.max_length"}
STAGE_KEYS = {
    "sft": {"max_epochs": "train.max_epochs"},
    "rm": {"max_epochs": "train.max_epochs"},
    "dpo": {"max_epochs": "train.max_epochs", "beta": "dpo.beta", "loss_type": "dpo.loss_type"},
    "kto": {"max_epochs": "train.max_epochs", "beta": "kto.beta", "loss_type": "kto.loss_type",
            "desirable_weight": "kto.desirable_weight", "undesirable_weight": "kto.undesirable_weight"},
    "orpo": {"max_epochs": "train.max_epochs", "beta": "orpo.beta"},
    "ppo": {"num_episodes": "ppo.num_episodes", "kl_coef": "ppo.kl_coef", "rollout_engine": "rollout.engine"},
    "grpo": {"num_episodes": "grpo.num_episodes", "num_generations": "grpo.num_generations",
             "rollout_engine": "rollout.engine"},
}


def set_dotted(config: dict, key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    for section in sections:
        config = config.setdefault(section, {})
    config[leaf] = value


def stage_config(stage: str, params: dict[str, Any]) -> dict:
    """The stage config from a component's inputs; `settings` ({"dotted.key": value}) wins."""
    # SFT reads the base model straight from its URI; later stages take the previous stage's Model.
    model_uri = params.get("base_model_uri") or params["base_model"].uri
    config: dict = {"model": {"path": model_uri},
                    "data": {"train_path": params["train_dataset"].uri, "eval_path": params["eval_dataset"].uri}}
    for name, key in {**COMMON_KEYS, **STAGE_KEYS[stage]}.items():
        set_dotted(config, key, params[name])
    if stage in ("ppo", "grpo"):
        # A reward function, when given, wins over the reward model (PPO's critic still starts there).
        if params.get("reward_function"):
            config["reward"] = {"function": params["reward_function"]}
        else:
            config["reward"] = {"model_path": params["reward_model"].uri}
        if stage == "ppo" and params.get("reward_model") is not None:
            set_dotted(config, "ppo.critic_model_path", params["reward_model"].uri)
    if params.get("environment"):  # multi-turn episodes (trainer.agents)
        set_dotted(config, "environment.name", params["environment"])
    for key, value in (params.get("settings") or {}).items():
        set_dotted(config, key, value)
    return config


def _is_given(value: Any) -> bool:
    return value is not None and value != "" and value != {} and value != []


def cluster_options(params: dict[str, Any], environ: Mapping[str, str] | None = None, *,
                    config: Mapping[str, Any] | None = None) -> ClusterOptions:
    """Where the stage's job runs: the component's parameters over the platform's defaults.

    Platform defaults come from the pod's environment (`PlatformDefaults`, fed by the chart's
    ConfigMap). A parameter given explicitly wins; an empty one, or a trainer image equal to the
    components' published default, leaves the platform's value. A job whose stage config (`config`,
    resolved once by the caller) may sample with vLLM (`rollout.engine` vllm or auto) runs the trainer
    image's vLLM variant in its place (`ALIGNFLOW_TRAINER_VLLM_IMAGE`). Parameters named like an option a
    component or a run may set (settings/options.py: `node_selector`, `pending_timeout_seconds`, ...)
    are taken too, so a component can expose any of them, and last the run's `scheduling` parameter
    (a JSON object of the options a run may set, see settings/scheduling.py). Raises LaunchError naming the ConfigMap key or the
    `scheduling.<key>` that holds a bad value.
    """
    platform = PlatformDefaults.from_environment(environ)
    gpus = params["gpus_per_node"]
    image = params.get("trainer_image")
    if uses_vllm(config or {}):  # the image's vLLM variant: the platform's, else the published one
        if not _is_given(image) or image in (PUBLISHED_TRAINER_IMAGE, PUBLISHED_TRAINER_VLLM_IMAGE):
            image = platform.trainer_vllm_image or PUBLISHED_TRAINER_VLLM_IMAGE
    elif not _is_given(image) or (image == PUBLISHED_TRAINER_IMAGE and platform.trainer_image):
        image = platform.trainer_image or PUBLISHED_TRAINER_IMAGE
    options: dict[str, Any] = {
        "mode": params["launcher_mode"], "image": image, "num_nodes": params["num_nodes"],
        "nproc_per_node": max(gpus, 1), "gpus_per_node": gpus, "env": platform.job_env,
        "allowed_images": platform.allowed_images, "allowed_secrets": platform.allowed_secrets,
    }
    options.update(platform.options)  # every option the platform's ConfigMap sets
    # Policy stays the platform's (`set_by=PLATFORM`): the MLflow Secret, the namespace (the component's own), the
    # job kind; the allow-lists are no options at all.
    options.update({name: params[name] for name in options_set_by(RUN, COMPONENT) if _is_given(params.get(name))})
    options.update(scheduling_overrides(params.get("scheduling")))  # the run's `scheduling` parameter wins
    return ClusterOptions(**options)


def uses_vllm(config: Mapping[str, Any]) -> bool:
    """Whether a stage config may sample with vLLM (its `rollout.engine` is `vllm`, or `auto`, which chooses in the
    pod among the engines its image has), so its job needs the trainer image's vLLM variant. Read from the
    resolved config only: `settings` may set the engine as a dotted key or inside a nested `rollout` section, and
    either way the config is what the trainer runs."""
    return (config.get("rollout") or {}).get("engine") in ("vllm", "auto")


def default_job_root(model_uri: str, run_id: str, stage: str) -> str:
    """Checkpoint root of a stage: `<pipeline root>/<pipeline>/<run id>/alignflow-jobs/<stage>`.

    KFP names output URIs `.../<run id>/<task>/<execution id>/<output>`; a retried task gets a new
    execution id, so the root is cut at the run id to let the retry find its checkpoints. Where the
    URI does not contain the run id (kfp.local), the folder beside the model is used.
    """
    uri = model_uri.rstrip("/")
    marker = f"/{run_id}/"
    if run_id and marker in uri:
        return uri[:uri.index(marker) + len(marker)] + f"alignflow-jobs/{stage}"
    return posixpath.join(posixpath.dirname(uri), "job")


def run_training_component(stage: str, params: dict[str, Any]) -> dict[str, float]:
    """Run the stage's job and publish its Model, Metrics and Markdown report."""
    model, metrics, report = params["model"], params["metrics"], params["report"]
    job_root = params.get("job_root") or default_job_root(model.uri, params["run_id"], stage)
    config = stage_config(stage, params)
    cluster = cluster_options(params, config=config)
    # The stage's run nests under the pipeline's MLflow run (components/lineage), or under KFP's run for this task
    # where KFP's MLflow integration is on (components/lineage/kfp_mlflow.py). A local job runs beside this pod's
    # own service-account token; a pod on the cluster has one for MLflow only where the platform mounts it.
    from components.lineage.kfp_mlflow import stage_job_env

    has_token = cluster.mode == "local" or bool(cluster.mlflow_token_audience)
    cluster.env = {**cluster.env, **stage_job_env(params.get("parent_run_id") or "", params.get("task_name") or "",
                                                  has_token=has_token)}
    final = run_stage_job(stage, config, model_uri=model.uri, job_root=job_root, run_id=params["run_id"],
                          task=f"{stage}", cluster=cluster)
    for key, value in final.items():
        if isinstance(value, (int, float)):
            metrics.log_metric(key.replace("/", "_"), float(value))
    model.metadata["stage"] = stage
    if "environment" in config:  # the evaluation runs episodes as this stage trained on them (components/evaluate)
        model.metadata["environment"] = config["environment"]
        model.metadata["generation_stop"] = config.get("generation", {}).get("stop", [])
    with open(report.path, "w") as handle:
        handle.write(stage_report(stage, config, final, job_root))
    if params.get("curves") is not None:  # the curves as a plot, beside the Markdown report
        from components.reports.curves import write_stage_html

        write_stage_html(params["curves"].path, stage, final, job_root)
    return final
