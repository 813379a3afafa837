"""rlhf-dpo: SFT -> DPO -> evaluate against the SFT model -> register only if DPO is better."""

from kfp import dsl

from components.dpo.component import train_dpo
from components.evaluate.component import evaluate_model
from components.images import TRAINER_IMAGE
from components.prepare.component import prepare_inputs
from components.register.component import register_model
from components.sft.component import train_sft
from pipelines.options import as_stage


@dsl.pipeline(name="rlhf-dpo", description="SFT, then DPO, evaluated against the SFT model and registered if better.")
def rlhf_dpo(
    source: str = "tiny",
    base_model_uri: str = "",
    launcher_mode: str = "kubernetes",
    trainer_image: str = TRAINER_IMAGE,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    sft_lr: float = 3e-3,
    sft_epochs: int = 20,
    sft_settings: dict = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5},
    dpo_lr: float = 5e-4,
    dpo_epochs: int = 2,
    dpo_beta: float = 0.1,
    dpo_settings: dict = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5},
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 4,
    registered_model_name: str = "alignflow-dpo",
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    inputs = prepare_inputs(source=source, base_model_uri=base_model_uri)
    inputs.set_caching_options(True)
    cluster = dict(run_id=run_id, launcher_mode=launcher_mode, trainer_image=trainer_image,
                   gpus_per_node=gpus_per_node, s3_secret=s3_secret)
    sft = as_stage(train_sft(base_model=inputs.outputs["base_model"], train_dataset=inputs.outputs["sft_train"],
                             eval_dataset=inputs.outputs["sft_eval"], lr=sft_lr, max_epochs=sft_epochs,
                             settings=sft_settings, **cluster))
    dpo = as_stage(train_dpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
                             eval_dataset=inputs.outputs["preference_eval"], lr=dpo_lr, max_epochs=dpo_epochs,
                             beta=dpo_beta, settings=dpo_settings, **cluster))
    evaluation = evaluate_model(model=dpo.outputs["model"], baseline=sft.outputs["model"],
                                prompts=inputs.outputs["prompts"], reward_function=reward_function,
                                max_new_tokens=max_new_tokens)
    with dsl.If(evaluation.outputs["Output"] > 0.0, name="dpo-beats-sft"):
        register_model(model=dpo.outputs["model"], name=registered_model_name)
