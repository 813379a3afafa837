"""The frame every pipeline shares: the lineage run and inputs first, SFT, evaluation and the registration gate last.

Every pipeline has the same frame, which `sft_then_align(pipeline, run, align)` writes from the run's
parameters (`run`, by name):

    lineage = open_run("rlhf-dpo", base_model_uri, dataset_sha256, sft_train_uri=..., ...)
    with run_stages(launcher_mode):
        inputs = prepare(lineage, base_model_uri, sft_train_uri=..., ...)
        sft = sft_stage(run, inputs, stage)
        candidate = align(sft, inputs, stage_arguments(cluster, lineage, scheduling))
        evaluate_and_register(candidate, sft, inputs, cluster, lineage, "rlhf-dpo", run)

A pipeline's own file declares its own parameters (KFP reads them from the function's signature; those
every pipeline takes are `pipelines/parameters.py`'s COMMON) and `align`: the stage or stages between SFT
and the evaluation (DPO; a reward model then PPO; ...).

`open_run` is the first step: it checks the datasets against their manifest hashes and opens the
pipeline's MLflow parent run, whose id every stage gets (`parent_run_id`) so its run nests under it.
`run_stages` is the exit handler: however the stages end, it deletes the run's PyTorchJobs and
closes the parent run with the pipeline's final state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, NamedTuple

from kfp import dsl

from components.evaluate.component import evaluate_model
from components.fingerprint.component import fingerprint_inputs
from components.lineage.component import finish_run, open_lineage
from components.prepare.component import prepare_inputs
from components.register.component import register_model
from components.sft.component import train_sft
from pipelines.options import as_stage, as_step

# The dataset URI parameters a pipeline may have, in the order the lineage run and `prepare_inputs` list them.
DATASETS = ("sft_train_uri", "sft_eval_uri", "preference_train_uri", "preference_eval_uri", "unpaired_train_uri",
            "unpaired_eval_uri", "prompts_uri", "eval_prompts_uri")
# The parameters that say where and how big every job is (`cluster_arguments`).
CLUSTER = ("launcher_mode", "trainer_image", "num_nodes", "gpus_per_node", "s3_secret")


def pipeline_version() -> str:
    """The version the parent run is tagged with: the alignflow package the pipeline was compiled from."""
    try:
        return metadata.version("alignflow")
    except metadata.PackageNotFoundError:
        return "unknown"


def open_run(pipeline: str, base_model_uri: str, dataset_sha256: dict, **dataset_uris: str) -> dsl.PipelineTask:
    """The first step: the datasets checked against `dataset_sha256` and the MLflow parent run opened.

    Never cached: each pipeline run gets its own parent run (a retried task reuses its own).
    """
    names = [name.removesuffix("_uri") for name in dataset_uris]
    lineage = as_step(open_lineage(pipeline=pipeline, pipeline_version=pipeline_version(),
                                   run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, dataset_names=names,
                                   dataset_uris=list(dataset_uris.values()), base_model_uri=base_model_uri,
                                   dataset_sha256=dataset_sha256))
    lineage.set_caching_options(False)
    return lineage


def run_stages(launcher_mode: str) -> dsl.ExitHandler:
    """Everything after `open_run`: when it ends, however it ends, the exit task deletes the run's
    PyTorchJobs and marks the parent run FINISHED, FAILED or KILLED (KFP allows one exit handler)."""
    finish = as_step(finish_run(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode))
    finish.set_caching_options(False)
    return dsl.ExitHandler(finish, name="run-stages")


def prepare(lineage: dsl.PipelineTask, base_model_uri: str, **dataset_uris: str) -> dsl.PipelineTask:
    """The run's datasets, copied in once they passed the lineage check; cached on their content (ETags)."""
    fingerprint = as_step(fingerprint_inputs(uris=[base_model_uri, *dataset_uris.values()]))
    fingerprint.set_caching_options(False)
    fingerprint.after(lineage)
    inputs = as_step(prepare_inputs(content_fingerprint=fingerprint.output, **dataset_uris))
    inputs.set_caching_options(True)
    return inputs


def stage_arguments(cluster: dict, lineage: dsl.PipelineTask, scheduling: dict) -> dict:
    """What every training stage receives: the cluster arguments, the MLflow parent run to nest under, its own task
    name (where KFP's MLflow integration opens a run per task, the stage's run nests under its task's:
    components/lineage/kfp_mlflow.py), and the run's `scheduling` overrides of the platform's pod defaults
    (components/launcher/settings/options.py)."""
    return {**cluster, "parent_run_id": lineage.output, "scheduling": scheduling,
            "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER}


def sft_stage(run: Mapping[str, Any], inputs: dsl.PipelineTask, stage: dict) -> dsl.PipelineTask:
    """SFT from the base model (read straight from its URI: a large model is not copied into the run)."""
    return as_stage(train_sft(base_model_uri=run["base_model_uri"], train_dataset=inputs.outputs["sft_train"],
                              eval_dataset=inputs.outputs["sft_eval"], lr=run["sft_lr"], max_epochs=run["sft_epochs"],
                              settings=run["sft_settings"], **stage))


def evaluate_and_register(candidate: Candidate, baseline: dsl.PipelineTask, inputs: dsl.PipelineTask, cluster: dict,
                          lineage: dsl.PipelineTask, pipeline: str, run: Mapping[str, Any]) -> None:
    """Compare the candidate with the baseline on held-out prompts; register it only if it is confidently better.

    The evaluation scores the registry's current champion too, in the same job on the same prompts,
    compares the models prompt by prompt and logs its metrics under the parent run whatever the gate
    decides. The gate's parameters (`gate_confidence`, `gate_min_effect`, `gate_guard_tolerance`): the
    candidate is registered (alias `candidate`) when the lower confidence bound of its gain over the baseline
    clears the minimum effect and no guard falls, and `champion` moves when the same holds against the
    champion (docs/pipelines.md, "The gate"). `eval_samples_per_prompt` and `eval_temperature` (1 and 0: one
    greedy answer each) say how each prompt is answered. Neither step is cached: the champion changes between
    runs. The run's `rollout_engine` samples the answers (`hf` where the pipeline has none; `vllm` or `auto` on
    the trainer image's vLLM variant); with an `environment`, each held-out prompt is a multi-turn episode in it.
    """
    extra = {"reward_model": candidate.reward_model.outputs["model"]} if candidate.reward_model is not None else {}
    if run.get("environment"):
        extra["environment"] = run["environment"]
    evaluation = as_step(evaluate_model(
        model=candidate.task.outputs["model"], baseline=baseline.outputs["model"],
        prompts=inputs.outputs["eval_prompts"], reward_function=run["reward_function"],
        max_new_tokens=run["max_new_tokens"], registered_model_name=run["registered_model_name"],
        parent_run_id=lineage.output, scheduling=run["scheduling"], rollout_engine=run.get("rollout_engine", "hf"),
        gate_confidence=run["gate_confidence"], gate_min_effect=run["gate_min_effect"],
        gate_guard_tolerance=run["gate_guard_tolerance"], samples_per_prompt=run["eval_samples_per_prompt"],
        temperature=run["eval_temperature"], **cluster, **extra))
    evaluation.set_caching_options(False)  # it scores whichever version is the champion now
    with dsl.If(evaluation.outputs["Output"] == "register", name="gate-opens"):
        gate = as_step(register_model(model=candidate.task.outputs["model"], evaluation=evaluation.outputs["metrics"],
                                      name=run["registered_model_name"], parent_run_id=lineage.output,
                                      run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, pipeline=pipeline))
        gate.set_caching_options(False)  # the registry changes between runs (a new champion)


def cluster_arguments(run: Mapping[str, Any]) -> dict:
    """What every job-launching component receives: where and how big its job is."""
    return dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, **{name: run[name] for name in CLUSTER})


class Candidate(NamedTuple):
    """What a pipeline's own stages hand the frame: the model the gate judges, and what else the evaluation needs."""

    task: dsl.PipelineTask
    """The stage whose `model` output is the candidate."""
    reward_model: dsl.PipelineTask | None = None
    """A reward model stage whose `model` also scores the held-out answers (rlhf-ppo), or None."""


def sft_then_align(pipeline: str, run: Mapping[str, Any],
                   align: Callable[[dsl.PipelineTask, dsl.PipelineTask, dict], Candidate]) -> None:
    """The whole frame of every pipeline: what comes before and after the stages that make the candidate.

    Lineage first, then inside the exit handler: the inputs, SFT from the base model, `align(sft, inputs,
    stage_arguments)` (the pipeline's own stages, started from SFT's model: DPO; a reward model then PPO;
    ...), and the evaluation of its candidate against SFT with the registration gate.

    Args:
        pipeline: The pipeline's name (the lineage run and the registered version are tagged with it).
        run: The pipeline's parameters by name (`with_common_parameters` hands them over); the frame reads
            the base model, the dataset URIs it has of `DATASETS`, the cluster, SFT's and the evaluation's.
        align: Builds the pipeline's stages after SFT and returns its `Candidate`.
    """
    datasets = {name: run[name] for name in DATASETS if name in run}
    cluster = cluster_arguments(run)
    lineage = open_run(pipeline, run["base_model_uri"], run["dataset_sha256"], **datasets)
    stage = stage_arguments(cluster, lineage, run["scheduling"])
    with run_stages(run["launcher_mode"]):
        inputs = prepare(lineage, run["base_model_uri"], **datasets)
        sft_task = sft_stage(run, inputs, stage)
        evaluate_and_register(align(sft_task, inputs, stage), sft_task, inputs, cluster, lineage, pipeline, run)
