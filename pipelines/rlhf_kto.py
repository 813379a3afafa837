"""rlhf-kto: SFT -> KTO on unpaired feedback -> evaluate against the SFT model -> register only if KTO is better.

KTO has its own pipeline rather than a stage parameter of rlhf-dpo: it reads other data (unpaired
rows with a label, not pairs) and has its own knobs (the desirable and undesirable weights); see
the README's "Preference stages".
"""

from kfp import dsl

from components.kto.component import train_kto
from pipelines.options import as_stage
from pipelines.parameters import documented
from pipelines.steps import Candidate, cluster_arguments, sft_then_align


@dsl.pipeline(name="rlhf-kto", description="SFT, then KTO on unpaired feedback, evaluated against SFT, registered if better.")
@documented
def rlhf_kto(
    base_model_uri: str,
    sft_train_uri: str,
    unpaired_train_uri: str,
    eval_prompts_uri: str,
    reward_function: str,
    sft_eval_uri: str = "",
    unpaired_eval_uri: str = "",
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
    kto_lr: float = 1e-6,
    kto_epochs: int = 1,
    kto_beta: float = 0.1,
    kto_desirable_weight: float = 1.0,
    kto_undesirable_weight: float = 1.0,
    kto_settings: dict = {},
    max_new_tokens: int = 256,
    gate_confidence: float = 0.95,
    gate_min_effect: float = 0.05,
    gate_guard_tolerance: float = 0.05,
    eval_samples_per_prompt: int = 1,
    eval_temperature: float = 0.0,
    registered_model_name: str = "alignflow-kto",
):
    """SFT, then KTO on unpaired feedback, evaluated against the SFT model and registered if better."""
    datasets = dict(sft_train_uri=sft_train_uri, sft_eval_uri=sft_eval_uri, unpaired_train_uri=unpaired_train_uri,
                    unpaired_eval_uri=unpaired_eval_uri, eval_prompts_uri=eval_prompts_uri)
    cluster = cluster_arguments(launcher_mode, trainer_image, num_nodes, gpus_per_node, s3_secret)

    def kto(sft, inputs, stage):
        kto_task = train_kto(base_model=sft.outputs["model"], train_dataset=inputs.outputs["unpaired_train"],
                             eval_dataset=inputs.outputs["unpaired_eval"], lr=kto_lr, max_epochs=kto_epochs,
                             beta=kto_beta, desirable_weight=kto_desirable_weight,
                             undesirable_weight=kto_undesirable_weight, settings=kto_settings, **stage)
        return Candidate(as_stage(kto_task))

    sft_then_align("rlhf-kto", base_model_uri, datasets, dataset_sha256, cluster, scheduling,
                   (sft_lr, sft_epochs, sft_settings), kto, reward_function, max_new_tokens, registered_model_name,
                   gate=(gate_confidence, gate_min_effect, gate_guard_tolerance, eval_samples_per_prompt,
                         eval_temperature))
