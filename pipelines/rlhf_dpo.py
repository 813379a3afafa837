"""rlhf-dpo: SFT -> DPO -> evaluate against the SFT model on held-out prompts -> register only if DPO is better."""

from kfp import dsl

from components.dpo.component import train_dpo
from pipelines.options import as_stage
from pipelines.parameters import pipeline_parameters
from pipelines.steps import Candidate, sft_then_align


@dsl.pipeline(name="rlhf-dpo", description="SFT, then DPO, evaluated against the SFT model and registered if better.")
@pipeline_parameters
def rlhf_dpo(
    base_model_uri: str, sft_train_uri: str, preference_train_uri: str, eval_prompts_uri: str, reward_function: str,
    sft_eval_uri: str = "", preference_eval_uri: str = "",
    dpo_lr: float = 5e-7, dpo_epochs: int = 1, dpo_beta: float = 0.1, dpo_settings: dict = {},
    registered_model_name: str = "alignflow-dpo", *, run: dict,
):
    def dpo(sft, inputs, stage):
        return Candidate(as_stage(train_dpo(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
            eval_dataset=inputs.outputs["preference_eval"], lr=dpo_lr, max_epochs=dpo_epochs, beta=dpo_beta,
            settings=dpo_settings, **stage)))

    sft_then_align("rlhf-dpo", run, dpo)
