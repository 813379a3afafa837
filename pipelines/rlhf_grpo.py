"""rlhf-grpo: SFT -> GRPO on a reward function -> evaluate against SFT -> register only if GRPO is better."""

from kfp import dsl

from components.grpo.component import train_grpo
from pipelines.options import as_stage
from pipelines.steps import cluster_arguments, evaluate_and_register, prepare_and_sft, with_cleanup

TINY = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5}
TINY_GRPO = {"train.micro_batch_size": 64, "data.max_length": 32, "optimizer.scheduler": "constant",
             "generation.max_new_tokens": 4, "generation.temperature": 0.7, "grpo.rollout_batch_size": 32,
             "grpo.mini_batch_size": 64}


@dsl.pipeline(name="rlhf-grpo", description="SFT, then GRPO on a reward function; registered if it beats SFT.")
def rlhf_grpo(
    source: str = "tiny",
    base_model_uri: str = "",
    launcher_mode: str = "kubernetes",
    trainer_image: str = "ghcr.io/alignflow/trainer:latest",
    gpus_per_node: int = 1,
    s3_secret: str = "",
    sft_lr: float = 3e-3,
    sft_epochs: int = 20,
    sft_settings: dict = TINY,
    grpo_lr: float = 5e-4,
    grpo_episodes: int = 40,
    grpo_generations: int = 8,
    grpo_settings: dict = TINY_GRPO,
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 4,
    registered_model_name: str = "alignflow-grpo",
):
    cluster = cluster_arguments(launcher_mode, trainer_image, gpus_per_node, s3_secret)
    with with_cleanup(launcher_mode):
        inputs, sft = prepare_and_sft(source, base_model_uri, cluster, sft_lr, sft_epochs, sft_settings)
        grpo = as_stage(train_grpo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["prompts"],
                                   eval_dataset=inputs.outputs["prompts"], reward_function=reward_function,
                                   lr=grpo_lr, num_episodes=grpo_episodes, num_generations=grpo_generations,
                                   settings=grpo_settings, **cluster))
        evaluate_and_register(grpo, sft, inputs, reward_function, max_new_tokens, registered_model_name)
