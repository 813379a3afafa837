"""The frame every pipeline shares: the lineage run and inputs first, SFT, evaluation and the registration gate last.

Every pipeline has the same frame, which `sft_then_align` writes:

    lineage = open_run("rlhf-dpo", base_model_uri, dataset_sha256, sft_train_uri=..., ...)
    with run_stages(launcher_mode):
        inputs = prepare(lineage, base_model_uri, sft_train_uri=..., ...)
        sft = sft_stage(...)
        candidate = align(sft, inputs, stage_arguments(cluster, lineage, scheduling))
        evaluate_and_register(candidate.task, sft, ..., lineage, "rlhf-dpo", gate=...)

A pipeline's own file declares its parameters (KFP reads them from the function's signature) and
`align`: the stage or stages between SFT and the evaluation (DPO; a reward model then PPO; ...).

`open_run` is the first step: it checks the datasets against their manifest hashes and opens the
pipeline's MLflow parent run, whose id every stage gets (`parent_run_id`) so its run nests under it.
`run_stages` is the exit handler: however the stages end, it deletes the run's PyTorchJobs and
closes the parent run with the pipeline's final state.
"""

from collections.abc import Callable
from importlib import metadata
from typing import NamedTuple

from kfp import dsl

from components.evaluate.component import evaluate_model
from components.fingerprint.component import fingerprint_inputs
from components.lineage.component import finish_run, open_lineage
from components.prepare.component import prepare_inputs
from components.register.component import register_model
from components.sft.component import train_sft
from pipelines.options import as_stage, as_step


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
    """What every training stage receives: the cluster arguments, the MLflow parent run to nest under, and the
    run's `scheduling` overrides of the platform's pod defaults (components/launcher/settings/options.py)."""
    return {**cluster, "parent_run_id": lineage.output, "scheduling": scheduling}


def sft_stage(base_model_uri: str, inputs: dsl.PipelineTask, stage: dict, sft_lr: float, sft_epochs: int,
              sft_settings: dict) -> dsl.PipelineTask:
    """SFT from the base model (read straight from its URI: a large model is not copied into the run)."""
    return as_stage(train_sft(base_model_uri=base_model_uri, train_dataset=inputs.outputs["sft_train"],
                              eval_dataset=inputs.outputs["sft_eval"], lr=sft_lr, max_epochs=sft_epochs,
                              settings=sft_settings, **stage))


def evaluate_and_register(candidate: dsl.PipelineTask, baseline: dsl.PipelineTask, inputs: dsl.PipelineTask,
                          cluster: dict, reward_function: str, max_new_tokens: int, registered_model_name: str,
                          lineage: dsl.PipelineTask, pipeline: str, scheduling: dict,
                          reward_model: dsl.PipelineTask | None = None, rollout_engine: str = "hf",
                          environment: str = "", *, gate: tuple[float, float, float, int, float]) -> None:
    """Compare the candidate with the baseline on held-out prompts; register it only if it is confidently better.

    The evaluation scores the registry's current champion too, in the same job on the same prompts,
    compares the models prompt by prompt and logs its metrics under the parent run whatever the gate
    decides. `gate` is (confidence, minimum effect, guard tolerance): the candidate is registered (alias
    `candidate`) when the lower confidence bound of its gain over the baseline clears the minimum effect
    and no guard falls, and `champion` moves when the same holds against the champion (docs/pipelines.md,
    "The gate"). `gate` ends with the samples per prompt and their temperature (1 and 0: one greedy
    answer each). Neither step is cached: the champion changes between runs. `rollout_engine` samples the
    answers (`hf`; `vllm` or `auto` on the trainer image's vLLM variant); with an `environment`, each held-out
    prompt is a multi-turn episode in it.
    """
    confidence, min_effect, guard_tolerance, samples_per_prompt, temperature = gate
    extra = {"reward_model": reward_model.outputs["model"]} if reward_model is not None else {}
    if environment:
        extra["environment"] = environment
    evaluation = as_step(evaluate_model(model=candidate.outputs["model"], baseline=baseline.outputs["model"],
                                        prompts=inputs.outputs["eval_prompts"], reward_function=reward_function,
                                        max_new_tokens=max_new_tokens, registered_model_name=registered_model_name,
                                        parent_run_id=lineage.output, scheduling=scheduling,
                                        rollout_engine=rollout_engine, gate_confidence=confidence,
                                        gate_min_effect=min_effect, gate_guard_tolerance=guard_tolerance,
                                        samples_per_prompt=samples_per_prompt, temperature=temperature,
                                        **cluster, **extra))
    evaluation.set_caching_options(False)  # it scores whichever version is the champion now
    with dsl.If(evaluation.outputs["Output"] == "register", name="gate-opens"):
        gate = as_step(register_model(model=candidate.outputs["model"], evaluation=evaluation.outputs["metrics"],
                                      name=registered_model_name, parent_run_id=lineage.output,
                                      run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, pipeline=pipeline))
        gate.set_caching_options(False)  # the registry changes between runs (a new champion)


def cluster_arguments(launcher_mode: str, trainer_image: str, num_nodes: int, gpus_per_node: int,
                      s3_secret: str) -> dict:
    """What every job-launching component receives: where and how big its PyTorchJob is."""
    return dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode, trainer_image=trainer_image,
                num_nodes=num_nodes, gpus_per_node=gpus_per_node, s3_secret=s3_secret)


class Candidate(NamedTuple):
    """What a pipeline's own stages hand the frame: the model the gate judges, and what else the evaluation needs."""

    task: dsl.PipelineTask
    """The stage whose `model` output is the candidate."""
    reward_model: dsl.PipelineTask | None = None
    """A reward model stage whose `model` also scores the held-out answers (rlhf-ppo), or None."""


def sft_then_align(pipeline: str, base_model_uri: str, datasets: dict[str, str], dataset_sha256: dict, cluster: dict,
                   scheduling: dict, sft: tuple[float, int, dict],
                   align: Callable[[dsl.PipelineTask, dsl.PipelineTask, dict], Candidate],
                   reward_function: str, max_new_tokens: int, registered_model_name: str,
                   rollout_engine: str = "hf", environment: str = "", *,
                   gate: tuple[float, float, float, int, float]) -> None:
    """The whole frame of every pipeline: what comes before and after the stages that make the candidate.

    Lineage first, then inside the exit handler: the inputs, SFT from the base model, `align(sft, inputs,
    stage_arguments)` (the pipeline's own stages, started from SFT's model: DPO; a reward model then PPO;
    ...), and the evaluation of its candidate against SFT with the registration gate.

    Args:
        pipeline: The pipeline's name (the lineage run and the registered version are tagged with it).
        base_model_uri: The base model SFT starts from.
        datasets: The pipeline's dataset URI parameters, by parameter name (`sft_train_uri=...`).
        dataset_sha256: The datasets' expected hashes (`open_run`).
        cluster: `cluster_arguments(...)`.
        scheduling: The run's overrides of the platform's pod defaults.
        sft: SFT's (learning rate, epochs, settings).
        align: Builds the pipeline's stages after SFT and returns its `Candidate`.
        reward_function: How the evaluation scores held-out answers.
        max_new_tokens: Longest evaluated answer.
        registered_model_name: The registry name the gate registers under.
        rollout_engine: What samples the evaluation's answers (`hf`, `vllm` or `auto`).
        environment: With a name, each held-out prompt is evaluated as a multi-turn episode in that environment.
        gate: The gate's (confidence, minimum effect, guard tolerance, samples per prompt, temperature)
            (`evaluate_and_register`).
    """
    lineage = open_run(pipeline, base_model_uri, dataset_sha256, **datasets)
    stage = stage_arguments(cluster, lineage, scheduling)
    with run_stages(cluster["launcher_mode"]):
        inputs = prepare(lineage, base_model_uri, **datasets)
        sft_task = sft_stage(base_model_uri, inputs, stage, *sft)
        candidate = align(sft_task, inputs, stage)
        evaluate_and_register(candidate.task, sft_task, inputs, cluster, reward_function, max_new_tokens,
                              registered_model_name, lineage, pipeline, scheduling,
                              reward_model=candidate.reward_model, rollout_engine=rollout_engine,
                              environment=environment, gate=gate)
