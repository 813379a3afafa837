"""Building and running an online stage (ppo, grpo) with the colocated `OLTrainer` loop.

Shares the setup of the supervised stages (`trainer.lifecycle.context`) and adds what
online RL needs: prompts, a frozen reference (only with a KL term), a critic (PPO), a reward
source, two boosters. Which of these a stage needs, its algorithm object says
(`trainer.algorithms.online.registry.online_algorithm`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import nn

from trainer.algorithms.online.registry import online_algorithm
from trainer.base import StopTraining
from trainer.checkpointing.checkpoint import CheckpointManager, ModelParts
from trainer.config import OnlineStageConfig, OptimizerConfig, PPOConfig
from trainer.data.collate import pad_sft
from trainer.data.dataset import load_prompt_dataset, load_sft_dataset
from trainer.lifecycle.context import (
    RunContext,
    build_context,
    close_context,
    examples_of,
    finish_stage,
    open_outputs,
    resume_latest,
    seed_everything,
)
from trainer.modeling.models import load_causal_lm, load_frozen, load_value_model
from trainer.modeling.optim import build_optimizer, build_scheduler
from trainer.online.loop import PPOTrainer, trainer_class
from trainer.online.prompts import num_extra_groups
from trainer.parallel.booster import Booster, Plugin, build_booster
from trainer.rewards.weighted import build_weighted_scorer
from trainer.rollout.builder import build_agent, build_rollout
from trainer.rollout.engines import engine_setup
from trainer.rollout.experience import ReplayBuffer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class OnlineResult:
    metrics: dict[str, float]
    actor: nn.Module
    critic: nn.Module | None


def total_optimizer_steps(config: OnlineStageConfig, world_size: int) -> int:
    options = config.algorithm
    per_rank = options.rollout_batch_size * options.num_collect_steps * config.num_generations
    minibatches = -(-per_rank // options.mini_batch_size)
    return options.num_episodes * options.num_update_epochs * minibatches


def boost_model_parts(booster: Booster, model: nn.Module, optimizer_config: OptimizerConfig, total_steps: int) -> ModelParts:
    return booster.boost_with_optimizer(model, lambda model: build_optimizer(model, optimizer_config),
                                        lambda optimizer: build_scheduler(optimizer, optimizer_config, total_steps))


def load_critic_model(config: PPOConfig, plugin: Plugin | None = None) -> nn.Module:
    """The PPO critic before boosting: `ppo.critic_model_path`, else the reward model, else the policy, with a value head.

    With an FSDP2 `plugin` (the critic booster's) it loads straight into shards, and boosting keeps it so.
    """
    critic_path = config.ppo.critic_model_path or config.reward.model_path or config.model.path
    return load_value_model(config.model.model_copy(update={"lora": None}), critic_path, key="ppo.critic_model_path",
                            plugin=plugin)


def boost_critic(context: RunContext, critic_model: nn.Module, config: PPOConfig,
                 total_steps: int) -> tuple[Booster, ModelParts]:
    """The critic on its own booster, with its optimizer at `ppo.critic_lr`."""
    booster = build_booster(context.plugin, config.train.mixed_precision)
    optimizer_config = config.optimizer.model_copy(update={"lr": config.ppo.critic_lr})
    return booster, boost_model_parts(booster, critic_model, optimizer_config, total_steps)


def build_online_trainer(config: OnlineStageConfig, context: RunContext,
                         stop_after_episodes: int | None = None) -> PPOTrainer:
    """Everything the colocated loop needs, loaded (data first) and boosted; outputs opened."""
    prompts = examples_of(context, "train", load_prompt_dataset(config.data.train_path, context.tokenizer,
                                                                config.data.max_length, config.data.skip_bad_rows))
    ptx_batches = load_ptx_batches(config, context)
    # Under FSDP2 every model loads straight into shards (no rank holds any of them whole). Their forwards
    # are then collectives: each rank generates (synced_gpus), scores and runs the reference on its own
    # rollout_batch_size rows once per collect step, so the calls line up across ranks.
    plugin = context.plugin
    algorithm = online_algorithm(config)
    scorer = build_weighted_scorer(config, plugin.device, plugin=plugin)
    agent = build_agent(config.environment, context.tokenizer)  # a code tool's sandbox proves itself here
    reference = load_frozen(load_causal_lm, config.model, plugin.device, plugin=plugin) \
        if algorithm.needs_reference else None
    seed_everything(config.train.seed)
    actor_model = load_causal_lm(config.model, plugin=plugin)
    # The critic's booster is built on the same plugin (`boost_critic`).
    critic_model = load_critic_model(config, plugin) if algorithm.needs_critic else None
    open_outputs(context)
    seed_everything(config.train.seed + context.env.rank)  # ranks sample different responses
    total = total_optimizer_steps(config, context.env.world_size)
    actor = boost_model_parts(context.booster, actor_model, config.optimizer, total)
    critic_booster, critic = boost_critic(context, critic_model, config, total) if critic_model is not None else (None, None)
    checkpoints = CheckpointManager(context.checkpoint_root(), context.booster, config.checkpoint.keep_last,
                                    boosters={"critic": critic_booster} if critic_booster else None)
    rollout = build_rollout(config.rollout, policy=actor[0], tokenizer=context.tokenizer, generation=config.generation,
                            scorer=scorer, device=plugin.device, setup=engine_setup(config), agent=agent,
                            rows_per_call=(config.algorithm.rollout_batch_size + num_extra_groups(config))
                            * config.num_generations)
    return trainer_class(algorithm)(
        context.booster, critic_booster, ReplayBuffer(), actor=actor, critic=critic, ref_model=reference,
        rollout=rollout, tokenizer=context.tokenizer, config=config, prompts=prompts, checkpoints=checkpoints,
        tracker=context.tracker, ptx_batches=ptx_batches, stop_after_episodes=stop_after_episodes)


def load_ptx_batches(config: OnlineStageConfig, context: RunContext) -> list[dict]:
    """PPO's pretraining (SFT) batches for the ptx loss, in micro-batches; empty without `ppo.ptx_data_path`."""
    path = online_algorithm(config).ptx_data_path
    if path is None:
        return []
    examples = examples_of(context, "ptx", load_sft_dataset(path, context.tokenizer, config.data.max_length,
                                                            config.data.skip_bad_rows))
    size = config.train.micro_batch_size
    return [pad_sft(examples[i:i + size], context.tokenizer.pad_token_id) for i in range(0, len(examples), size)]


def run_online_stage(config: OnlineStageConfig, stop_after_episodes: int | None = None) -> OnlineResult:
    """Train PPO or GRPO end to end: resume if possible, run episodes, export `<output_dir>/model`.

    Returns:
        Final metrics (with `eval/reward_before` and `eval/reward` when `data.eval_path` is set),
        the trained actor and, for PPO, the critic.
    """
    context = build_context(config)
    trainer = None
    try:
        eval_rows = None
        if config.data.eval_path:  # before the trainer opens the outputs: a bad row leaves nothing written
            eval_rows = examples_of(context, "eval", load_prompt_dataset(config.data.eval_path, context.tokenizer,
                                                                         config.data.max_length,
                                                                         config.data.skip_bad_rows))
        trainer = build_online_trainer(config, context, stop_after_episodes)
        metrics: dict[str, float] = {}
        resumed = resume_latest(context, trainer.checkpoints, trainer.components(), trainer.restore)
        if not resumed and eval_rows:
            metrics["eval/reward_before"] = trainer.evaluate(eval_rows)
        options = trainer.options
        try:
            trainer.fit(options.num_episodes, options.num_collect_steps, options.num_update_epochs)
        except StopTraining as stop:
            logger.info("%s", stop)
            return OnlineResult(trainer.last_metrics, trainer.actor, trainer.critic)
        trainer.check_finite_end()  # a run that ends inside a streak of skipped steps is not exported
        if eval_rows:
            metrics["eval/reward"] = trainer.evaluate(eval_rows)
        metrics.update(trainer.last_metrics, global_step=trainer.global_step, episodes=trainer.num_episodes_done)
        exports = {"model": trainer.actor} | ({"critic": trainer.critic} if trainer.critic is not None else {})
        finish_stage(context, exports, metrics, trainer.global_step, samples=trainer.samples)
        return OnlineResult(metrics, trainer.actor, trainer.critic)
    finally:
        if trainer is not None:
            trainer.rollout.close()  # a vLLM engine's memory and threads (`hf` holds nothing)
        close_context(context)

