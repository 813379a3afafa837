"""rlhf-kto: SFT -> KTO on unpaired feedback -> evaluate against the SFT model -> register only if KTO is better.

KTO has its own pipeline rather than a stage parameter of rlhf-dpo: it reads other data (unpaired
rows with a label, not pairs) and has its own knobs (the desirable and undesirable weights); see
the README's "Preference stages".
"""

from kfp import dsl

from components.kto.component import train_kto
from pipelines.options import as_stage
from pipelines.parameters import pipeline_parameters
from pipelines.steps import Candidate, sft_then_align


@dsl.pipeline(name="rlhf-kto", description="SFT, then KTO on unpaired feedback, evaluated against SFT, registered if better.")
@pipeline_parameters
def rlhf_kto(
    base_model_uri: str, sft_train_uri: str, unpaired_train_uri: str, eval_prompts_uri: str, reward_function: str,
    sft_eval_uri: str = "", unpaired_eval_uri: str = "",
    kto_lr: float = 1e-6, kto_epochs: int = 1, kto_beta: float = 0.1, kto_desirable_weight: float = 1.0,
    kto_undesirable_weight: float = 1.0, kto_settings: dict = {},
    registered_model_name: str = "alignflow-kto", *, run: dict,
):
    """SFT, then KTO on unpaired feedback, evaluated against the SFT model and registered if better."""

    def kto(sft, inputs, stage):
        return Candidate(as_stage(train_kto(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["unpaired_train"],
            eval_dataset=inputs.outputs["unpaired_eval"], lr=kto_lr, max_epochs=kto_epochs, beta=kto_beta,
            desirable_weight=kto_desirable_weight, undesirable_weight=kto_undesirable_weight,
            settings=kto_settings, **stage)))

    sft_then_align("rlhf-kto", run, kto)
