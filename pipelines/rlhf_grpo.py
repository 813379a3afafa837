"""rlhf-grpo: SFT -> GRPO on a reward function -> evaluate against SFT on held-out prompts -> register if better."""

from kfp import dsl

from components.grpo.component import train_grpo
from pipelines.options import as_stage
from pipelines.parameters import documented
from pipelines.steps import Candidate, cluster_arguments, sft_then_align


@dsl.pipeline(name="rlhf-grpo", description="SFT, then GRPO on a reward function; registered if it beats SFT.")
@documented
def rlhf_grpo(
    base_model_uri: str,
    sft_train_uri: str,
    prompts_uri: str,
    eval_prompts_uri: str,
    reward_function: str,
    sft_eval_uri: str = "",
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
    grpo_lr: float = 1e-6,
    grpo_episodes: int = 100,
    grpo_generations: int = 8,
    grpo_settings: dict = {},
    max_new_tokens: int = 256,
    gate_confidence: float = 0.95,
    gate_min_effect: float = 0.05,
    gate_guard_tolerance: float = 0.05,
    eval_samples_per_prompt: int = 1,
    eval_temperature: float = 0.0,
    registered_model_name: str = "alignflow-grpo",
    rollout_engine: str = "hf",
):
    datasets = dict(sft_train_uri=sft_train_uri, sft_eval_uri=sft_eval_uri, prompts_uri=prompts_uri,
                    eval_prompts_uri=eval_prompts_uri)
    cluster = cluster_arguments(launcher_mode, trainer_image, num_nodes, gpus_per_node, s3_secret)

    def grpo(sft, inputs, stage):
        grpo_task = train_grpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["prompts"],
                               eval_dataset=inputs.outputs["eval_prompts"], reward_function=reward_function,
                               lr=grpo_lr, num_episodes=grpo_episodes, num_generations=grpo_generations,
                               rollout_engine=rollout_engine, settings=grpo_settings, **stage)
        return Candidate(as_stage(grpo_task))

    sft_then_align("rlhf-grpo", base_model_uri, datasets, dataset_sha256, cluster, scheduling,
                   (sft_lr, sft_epochs, sft_settings), grpo, reward_function, max_new_tokens, registered_model_name,
                   rollout_engine,
                   gate=(gate_confidence, gate_min_effect, gate_guard_tolerance, eval_samples_per_prompt,
                         eval_temperature))
