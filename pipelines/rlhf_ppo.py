"""rlhf-ppo: SFT -> reward model -> PPO -> evaluate against SFT on held-out prompts -> register only if PPO is better."""

from kfp import dsl

from components.ppo.component import train_ppo
from components.rm.component import train_reward_model
from pipelines.options import as_stage
from pipelines.parameters import pipeline_parameters
from pipelines.steps import Candidate, sft_then_align


@dsl.pipeline(name="rlhf-ppo", description="SFT, a reward model, then PPO; evaluated against SFT and registered if better.")
@pipeline_parameters
def rlhf_ppo(
    base_model_uri: str, sft_train_uri: str, preference_train_uri: str, prompts_uri: str, eval_prompts_uri: str,
    sft_eval_uri: str = "", preference_eval_uri: str = "",
    rm_lr: float = 1e-5, rm_epochs: int = 1, rm_settings: dict = {},
    ppo_lr: float = 1e-6, ppo_episodes: int = 100, ppo_kl_coef: float = 0.05, ppo_reward_function: str = "",
    ppo_settings: dict = {}, reward_function: str = "", registered_model_name: str = "alignflow-ppo",
    rollout_engine: str = "hf", *, run: dict,
):
    def reward_model_then_ppo(sft, inputs, stage):
        reward_model = as_stage(train_reward_model(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["preference_train"],
            eval_dataset=inputs.outputs["preference_eval"], lr=rm_lr, max_epochs=rm_epochs, settings=rm_settings,
            **stage))
        ppo_task = train_ppo(base_model=sft.outputs["model"], train_dataset=inputs.outputs["prompts"],
                             eval_dataset=inputs.outputs["eval_prompts"], reward_model=reward_model.outputs["model"],
                             reward_function=ppo_reward_function, lr=ppo_lr, num_episodes=ppo_episodes,
                             kl_coef=ppo_kl_coef, rollout_engine=rollout_engine, settings=ppo_settings, **stage)
        return Candidate(as_stage(ppo_task), reward_model=reward_model)

    sft_then_align("rlhf-ppo", run, reward_model_then_ppo)
