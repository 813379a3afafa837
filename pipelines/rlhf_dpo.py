"""rlhf-dpo: SFT -> DPO -> evaluate against the SFT model on held-out prompts -> register only if DPO is better."""

from kfp import dsl

from components.dpo.component import train_dpo
from pipelines.options import as_stage
from pipelines.parameters import documented
from pipelines.steps import Candidate, cluster_arguments, sft_then_align


@dsl.pipeline(name="rlhf-dpo", description="SFT, then DPO, evaluated against the SFT model and registered if better.")
@documented
def rlhf_dpo(
    base_model_uri: str,
    sft_train_uri: str,
    preference_train_uri: str,
    eval_prompts_uri: str,
    reward_function: str,
    sft_eval_uri: str = "",
    preference_eval_uri: str = "",
    dataset_sha256: dict = {},
    launcher_mode: str = "kubernetes",
    trainer_image: str = "",
    num_nodes: int = 1,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    scheduling: dict = {},
    sft_lr: float = 2e-5,
    sft_epochs: int = 2,
    sft_settings: dict = {},
    dpo_lr: float = 5e-7,
    dpo_epochs: int = 1,
    dpo_beta: float = 0.1,
    dpo_settings: dict = {},
    max_new_tokens: int = 256,
    gate_confidence: float = 0.95,
    gate_min_effect: float = 0.05,
    gate_guard_tolerance: float = 0.05,
    eval_samples_per_prompt: int = 1,
    eval_temperature: float = 0.0,
    registered_model_name: str = "alignflow-dpo",
):
    datasets = dict(sft_train_uri=sft_train_uri, sft_eval_uri=sft_eval_uri, preference_train_uri=preference_train_uri,
                    preference_eval_uri=preference_eval_uri, eval_prompts_uri=eval_prompts_uri)
    cluster = cluster_arguments(launcher_mode, trainer_image, num_nodes, gpus_per_node, s3_secret)

    def dpo(sft, inputs, stage):
        dpo_task = train_dpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
                             eval_dataset=inputs.outputs["preference_eval"], lr=dpo_lr, max_epochs=dpo_epochs,
                             beta=dpo_beta, settings=dpo_settings, **stage)
        return Candidate(as_stage(dpo_task))

    sft_then_align("rlhf-dpo", base_model_uri, datasets, dataset_sha256, cluster, scheduling,
                   (sft_lr, sft_epochs, sft_settings), dpo, reward_function, max_new_tokens, registered_model_name,
                   gate=(gate_confidence, gate_min_effect, gate_guard_tolerance, eval_samples_per_prompt,
                         eval_temperature))
