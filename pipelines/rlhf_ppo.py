"""rlhf-ppo: SFT -> reward model -> PPO -> evaluate against the SFT model -> register only if PPO is better."""

from kfp import dsl

from components.ppo.component import train_ppo
from components.rm.component import train_reward_model
from pipelines.options import as_stage
from pipelines.steps import cluster_arguments, evaluate_and_register, prepare_and_sft, with_cleanup

TINY = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5}
TINY_PPO = {"train.micro_batch_size": 64, "data.max_length": 32, "optimizer.scheduler": "constant",
            "generation.max_new_tokens": 4, "generation.temperature": 0.7, "ppo.rollout_batch_size": 256,
            "ppo.mini_batch_size": 64, "ppo.critic_lr": 1e-3}


@dsl.pipeline(name="rlhf-ppo", description="SFT, a reward model, then PPO; evaluated against SFT and registered if better.")
def rlhf_ppo(
    source: str = "tiny",
    base_model_uri: str = "",
    launcher_mode: str = "kubernetes",
    trainer_image: str = "ghcr.io/alignflow/trainer:latest",
    gpus_per_node: int = 1,
    s3_secret: str = "",
    sft_lr: float = 3e-3,
    sft_epochs: int = 20,
    sft_settings: dict = TINY,
    rm_lr: float = 1e-3,
    rm_epochs: int = 15,
    rm_settings: dict = TINY,
    ppo_lr: float = 5e-4,
    ppo_episodes: int = 40,
    ppo_kl_coef: float = 0.02,
    ppo_reward_function: str = "",
    ppo_settings: dict = TINY_PPO,
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 4,
    registered_model_name: str = "alignflow-ppo",
):
    cluster = cluster_arguments(launcher_mode, trainer_image, gpus_per_node, s3_secret)
    with with_cleanup(launcher_mode):
        inputs, sft = prepare_and_sft(source, base_model_uri, cluster, sft_lr, sft_epochs, sft_settings)
        reward_model = as_stage(train_reward_model(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
            eval_dataset=inputs.outputs["preference_eval"], lr=rm_lr, max_epochs=rm_epochs, settings=rm_settings,
            **cluster))
        ppo = as_stage(train_ppo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["prompts"],
                                 eval_dataset=inputs.outputs["prompts"], reward_model=reward_model.outputs["model"],
                                 reward_function=ppo_reward_function, lr=ppo_lr, num_episodes=ppo_episodes,
                                 kl_coef=ppo_kl_coef, settings=ppo_settings, **cluster))
        evaluate_and_register(ppo, sft, inputs, reward_function, max_new_tokens, registered_model_name,
                              reward_model=reward_model)
