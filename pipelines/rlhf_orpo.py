"""rlhf-orpo: SFT -> ORPO on preference pairs -> evaluate against the SFT model -> register only if ORPO is better.

ORPO has its own pipeline rather than a stage parameter of rlhf-dpo: it has no reference model and
its own knob (the odds-ratio weight lambda), and its registered models are named for it; see the
README's "Preference stages".
"""

from kfp import dsl

from components.orpo.component import train_orpo
from pipelines.options import as_stage
from pipelines.parameters import pipeline_parameters
from pipelines.steps import Candidate, sft_then_align


@dsl.pipeline(name="rlhf-orpo", description="SFT, then ORPO on preference pairs, evaluated against SFT, registered if better.")
@pipeline_parameters
def rlhf_orpo(
    base_model_uri: str, sft_train_uri: str, preference_train_uri: str, eval_prompts_uri: str, reward_function: str,
    sft_eval_uri: str = "", preference_eval_uri: str = "",
    orpo_lr: float = 1e-6, orpo_epochs: int = 1, orpo_beta: float = 0.1, orpo_settings: dict = {},
    registered_model_name: str = "alignflow-orpo", *, run: dict,
):
    """SFT, then ORPO on preference pairs, evaluated against the SFT model and registered if better."""

    def orpo(sft, inputs, stage):
        return Candidate(as_stage(train_orpo(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
            eval_dataset=inputs.outputs["preference_eval"], lr=orpo_lr, max_epochs=orpo_epochs, beta=orpo_beta,
            settings=orpo_settings, **stage)))

    sft_then_align("rlhf-orpo", run, orpo)
