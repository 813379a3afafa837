"""rlhf-dpo: SFT -> DPO -> evaluate against the SFT model -> register only if DPO is better."""

from kfp import dsl

from components.dpo.component import train_dpo
from pipelines.options import as_stage
from pipelines.steps import cluster_arguments, evaluate_and_register, prepare_and_sft, with_cleanup

TINY = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5}


@dsl.pipeline(name="rlhf-dpo", description="SFT, then DPO, evaluated against the SFT model and registered if better.")
def rlhf_dpo(
    source: str = "tiny",
    base_model_uri: str = "",
    launcher_mode: str = "kubernetes",
    trainer_image: str = "ghcr.io/alignflow/trainer:latest",
    gpus_per_node: int = 1,
    s3_secret: str = "",
    sft_lr: float = 3e-3,
    sft_epochs: int = 20,
    sft_settings: dict = TINY,
    dpo_lr: float = 5e-4,
    dpo_epochs: int = 2,
    dpo_beta: float = 0.1,
    dpo_settings: dict = TINY,
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 4,
    registered_model_name: str = "alignflow-dpo",
):
    cluster = cluster_arguments(launcher_mode, trainer_image, gpus_per_node, s3_secret)
    with with_cleanup(launcher_mode):
        inputs, sft = prepare_and_sft(source, base_model_uri, cluster, sft_lr, sft_epochs, sft_settings)
        dpo = as_stage(train_dpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
                                 eval_dataset=inputs.outputs["preference_eval"], lr=dpo_lr, max_epochs=dpo_epochs,
                                 beta=dpo_beta, settings=dpo_settings, **cluster))
        evaluate_and_register(dpo, sft, inputs, reward_function, max_new_tokens, registered_model_name)
