"""rlhf-grpo: SFT -> GRPO on a reward function -> evaluate against SFT on held-out prompts -> register if better."""

from kfp import dsl

from components.grpo.component import train_grpo
from pipelines.options import as_stage
from pipelines.parameters import pipeline_parameters
from pipelines.steps import Candidate, sft_then_align


@dsl.pipeline(name="rlhf-grpo", description="SFT, then GRPO on a reward function; registered if it beats SFT.")
@pipeline_parameters
def rlhf_grpo(
    base_model_uri: str, sft_train_uri: str, prompts_uri: str, eval_prompts_uri: str, reward_function: str,
    sft_eval_uri: str = "",
    grpo_lr: float = 1e-6, grpo_episodes: int = 100, grpo_generations: int = 8, grpo_settings: dict = {},
    registered_model_name: str = "alignflow-grpo", rollout_engine: str = "hf", *, run: dict,
):
    def grpo(sft, inputs, stage):
        return Candidate(as_stage(train_grpo(
            base_model=sft.outputs["model"], train_dataset=inputs.outputs["prompts"],
            eval_dataset=inputs.outputs["eval_prompts"], reward_function=reward_function, lr=grpo_lr,
            num_episodes=grpo_episodes, num_generations=grpo_generations, rollout_engine=rollout_engine,
            settings=grpo_settings, **stage)))

    sft_then_align("rlhf-grpo", run, grpo)
