"""Pieces every pipeline shares: inputs and SFT first, evaluation and the registration gate last."""

from kfp import dsl

from components.cleanup.component import cleanup_jobs
from components.evaluate.component import evaluate_model
from components.fingerprint.component import fingerprint_inputs
from components.prepare.component import prepare_inputs
from components.register.component import register_model
from components.sft.component import train_sft
from pipelines.options import as_stage, as_step


def prepare(base_model_uri: str, **dataset_uris: str) -> dsl.PipelineTask:
    """The run's datasets, copied in; cached on their content (ETags), not on their URIs."""
    fingerprint = as_step(fingerprint_inputs(uris=[base_model_uri, *dataset_uris.values()]))
    fingerprint.set_caching_options(False)
    inputs = as_step(prepare_inputs(content_fingerprint=fingerprint.output, **dataset_uris))
    inputs.set_caching_options(True)
    return inputs


def sft_stage(base_model_uri: str, inputs: dsl.PipelineTask, cluster: dict, sft_lr: float, sft_epochs: int,
              sft_settings: dict) -> dsl.PipelineTask:
    """SFT from the base model (read straight from its URI: a large model is not copied into the run)."""
    return as_stage(train_sft(base_model_uri=base_model_uri, train_dataset=inputs.outputs["sft_train"],
                              eval_dataset=inputs.outputs["sft_eval"], lr=sft_lr, max_epochs=sft_epochs,
                              settings=sft_settings, **cluster))


def evaluate_and_register(candidate: dsl.PipelineTask, baseline: dsl.PipelineTask, inputs: dsl.PipelineTask,
                          cluster: dict, reward_function: str, max_new_tokens: int, registered_model_name: str,
                          reward_model: dsl.PipelineTask | None = None) -> None:
    """Compare the candidate with the baseline on held-out prompts; register it only if it scores higher."""
    extra = {"reward_model": reward_model.outputs["model"]} if reward_model is not None else {}
    evaluation = as_step(evaluate_model(model=candidate.outputs["model"], baseline=baseline.outputs["model"],
                                        prompts=inputs.outputs["eval_prompts"], reward_function=reward_function,
                                        max_new_tokens=max_new_tokens, **cluster, **extra))
    with dsl.If(evaluation.outputs["Output"] > 0.0, name="beats-baseline"):
        as_step(register_model(model=candidate.outputs["model"], name=registered_model_name))


def with_cleanup(launcher_mode: str) -> dsl.ExitHandler:
    """Wrap a pipeline's stages so its PyTorchJobs are deleted when the run ends, however it ends."""
    cleanup = as_step(cleanup_jobs(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode))
    return dsl.ExitHandler(cleanup, name="run-stages")


def cluster_arguments(launcher_mode: str, trainer_image: str, num_nodes: int, gpus_per_node: int,
                      s3_secret: str) -> dict:
    """What every job-launching component receives: where and how big its PyTorchJob is."""
    return dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode, trainer_image=trainer_image,
                num_nodes=num_nodes, gpus_per_node=gpus_per_node, s3_secret=s3_secret)
