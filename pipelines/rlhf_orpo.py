"""rlhf-orpo: SFT -> ORPO on preference pairs -> evaluate against the SFT model -> register only if ORPO is better.

ORPO has its own pipeline rather than a stage parameter of rlhf-dpo: it has no reference model and
its own knob (the odds-ratio weight lambda), and its registered models are named for it; see the
README's "Preference stages".
"""

from kfp import dsl

from components.orpo.component import train_orpo
from pipelines.options import as_stage
from pipelines.steps import cluster_arguments, sft_then_align


@dsl.pipeline(name="rlhf-orpo", description="SFT, then ORPO on preference pairs, evaluated against SFT, registered if better.")
def rlhf_orpo(
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
    orpo_lr: float = 1e-6,
    orpo_epochs: int = 1,
    orpo_beta: float = 0.1,
    orpo_settings: dict = {},
    max_new_tokens: int = 256,
    registered_model_name: str = "alignflow-orpo",
):
    """SFT, then ORPO on preference pairs, evaluated against the SFT model and registered if better.

    Args:
        base_model_uri: The base HF model (local, s3:// or minio://); SFT starts here.
        sft_train_uri: SFT rows (messages, or prompt/completion) as JSONL or Parquet.
        preference_train_uri: Preference rows (prompt, chosen, rejected) that ORPO trains on.
        eval_prompts_uri: Held-out prompt rows with answers, on which the candidate and SFT are compared.
        reward_function: Registered reward function that scores the held-out answers (the gate's judge).
        sft_eval_uri: Held-out SFT rows; empty skips SFT's evaluation.
        preference_eval_uri: Held-out preference rows; empty skips ORPO's evaluation.
        dataset_sha256: Expected SHA-256 of each dataset by name (e.g. {"preference_train": "..."}); a mismatch stops
            the run before training.
        launcher_mode: `kubernetes` runs each stage as a PyTorchJob; `local` runs its processes on this machine.
        trainer_image: Image of the training jobs; empty uses the platform's trainer image.
        num_nodes: Nodes per training job.
        gpus_per_node: GPUs per node (one process each; 0 runs one CPU process).
        s3_secret: Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for the jobs.
        scheduling: Overrides of the platform's scheduling defaults for every job's pods (components/launcher/scheduling.py).
        sft_lr: SFT's peak learning rate.
        sft_epochs: SFT's passes over its data.
        sft_settings: Any other SFT config fields, as {"dotted.key": value}.
        orpo_lr: ORPO's peak learning rate.
        orpo_epochs: ORPO's passes over its data.
        orpo_beta: ORPO's lambda, the weight of the odds-ratio term beside the chosen answer's NLL.
        orpo_settings: Any other ORPO config fields, as {"dotted.key": value}.
        max_new_tokens: Longest answer the evaluation generates.
        registered_model_name: MLflow registered model the gate registers a better candidate under.
    """
    datasets = dict(sft_train_uri=sft_train_uri, sft_eval_uri=sft_eval_uri, preference_train_uri=preference_train_uri,
                    preference_eval_uri=preference_eval_uri, eval_prompts_uri=eval_prompts_uri)
    cluster = cluster_arguments(launcher_mode, trainer_image, num_nodes, gpus_per_node, s3_secret)

    def orpo(sft, inputs, stage):
        return as_stage(train_orpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
                                   eval_dataset=inputs.outputs["preference_eval"], lr=orpo_lr, max_epochs=orpo_epochs,
                                   beta=orpo_beta, settings=orpo_settings, **stage))

    sft_then_align("rlhf-orpo", base_model_uri, datasets, dataset_sha256, cluster, scheduling,
                   (sft_lr, sft_epochs, sft_settings), orpo, reward_function, max_new_tokens,
                   registered_model_name)
