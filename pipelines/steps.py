"""Pieces every pipeline shares: inputs and SFT first, evaluation and the registration gate last."""

from kfp import dsl

from components.cleanup.component import cleanup_jobs
from components.evaluate.component import evaluate_model
from components.prepare.component import prepare_inputs
from components.register.component import register_model
from components.sft.component import train_sft
from pipelines.options import as_stage


def prepare_and_sft(source: str, base_model_uri: str, cluster: dict, sft_lr: float, sft_epochs: int,
                    sft_settings: dict) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
    """The inputs task (cached) and the SFT stage on its data."""
    inputs = prepare_inputs(source=source, base_model_uri=base_model_uri)
    inputs.set_caching_options(True)
    sft = as_stage(train_sft(base_model=inputs.outputs["base_model"], train_dataset=inputs.outputs["sft_train"],
                             eval_dataset=inputs.outputs["sft_eval"], lr=sft_lr, max_epochs=sft_epochs,
                             settings=sft_settings, **cluster))
    return inputs, sft


def evaluate_and_register(candidate: dsl.PipelineTask, baseline: dsl.PipelineTask, inputs: dsl.PipelineTask,
                          reward_function: str, max_new_tokens: int, registered_model_name: str,
                          reward_model: dsl.PipelineTask | None = None) -> None:
    """Compare the candidate with the baseline; register the candidate only if its checkable reward is higher."""
    extra = {"reward_model": reward_model.outputs["model"]} if reward_model is not None else {}
    evaluation = evaluate_model(model=candidate.outputs["model"], baseline=baseline.outputs["model"],
                                prompts=inputs.outputs["prompts"], reward_function=reward_function,
                                max_new_tokens=max_new_tokens, **extra)
    with dsl.If(evaluation.outputs["Output"] > 0.0, name="beats-baseline"):
        register_model(model=candidate.outputs["model"], name=registered_model_name)


def with_cleanup(launcher_mode: str) -> dsl.ExitHandler:
    """Wrap a pipeline's stages so its PyTorchJobs are deleted when the run ends, however it ends."""
    return dsl.ExitHandler(cleanup_jobs(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode),
                           name="run-stages")


def cluster_arguments(launcher_mode: str, trainer_image: str, gpus_per_node: int, s3_secret: str) -> dict:
    return dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, launcher_mode=launcher_mode, trainer_image=trainer_image,
                gpus_per_node=gpus_per_node, s3_secret=s3_secret)
