"""Building and running an online stage (ppo, grpo) with the colocated `OLTrainer` loop.

Shares the setup of the supervised stages (`stages.build_context`, `open_outputs`) and adds what
online RL needs: prompts, a frozen reference, a critic (PPO), a reward source, two boosters.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.booster import Booster, unwrap_model
from trainer.buffer import ReplayBuffer
from trainer.checkpoint import CheckpointManager, Component
from trainer.config import OnlineStageConfig, OptimizerConfig, PPOConfig
from trainer.data.collate import pad_sft
from trainer.data.dataset import load_rows, load_sft_dataset
from trainer.models import export_model, load_causal_lm, load_value_model
from trainer.online import PPOTrainer, trainer_class
from trainer.optim import build_optimizer, build_scheduler
from trainer.rewards import FunctionScorer, RewardModelScorer, load_reward_function
from trainer.stages import RunContext, build_context, open_outputs, publish_outputs, seed_everything
from trainer.storage import join_uri
from trainer.supervised import StopTraining

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class OnlineResult:
    metrics: dict[str, float]
    actor: nn.Module
    critic: nn.Module | None


def build_scorer(config: OnlineStageConfig, device: torch.device) -> Any:
    """The configured reward source: a function by import path, or a frozen reward model on `device`."""
    if config.reward.function is not None:
        return FunctionScorer(load_reward_function(config.reward.function))
    reward_model = load_value_model(config.model.model_copy(update={"lora": None, "gradient_checkpointing": False}),
                                    config.reward.model_path, key="reward.model_path")
    return RewardModelScorer(reward_model.requires_grad_(False).eval().to(device))


def frozen_reference(config: OnlineStageConfig, context: RunContext) -> nn.Module:
    plain = config.model.model_copy(update={"lora": None, "gradient_checkpointing": False})
    return load_causal_lm(plain).requires_grad_(False).eval().to(context.plugin.device)


def total_optimizer_steps(config: OnlineStageConfig, world_size: int) -> int:
    options = config.ppo if isinstance(config, PPOConfig) else config.grpo
    per_rank = options.rollout_batch_size * options.num_collect_steps * getattr(options, "num_generations", 1)
    minibatches = -(-per_rank // options.mini_batch_size)
    return options.num_episodes * options.num_update_epochs * minibatches


def boost_component(booster: Booster, model: nn.Module, optimizer_config: OptimizerConfig, total_steps: int) -> Component:
    model, *_ = booster.boost(model)
    optimizer = build_optimizer(model, optimizer_config)
    booster.register_optimizer(model, optimizer)
    return model, optimizer, build_scheduler(optimizer, optimizer_config, total_steps)


def build_online_trainer(config: OnlineStageConfig, context: RunContext,
                         stop_after_episodes: int | None = None) -> PPOTrainer:
    """Everything the colocated loop needs, loaded (data first) and boosted; outputs opened."""
    prompts = load_rows(config.data.train_path, "prompt", skip_bad_rows=config.data.skip_bad_rows).examples
    ptx_batches = _ptx_batches(config, context)
    scorer = build_scorer(config, context.plugin.device)
    reference = frozen_reference(config, context)
    seed_everything(config.train.seed)
    actor_model = load_causal_lm(config.model)
    critic_model = None
    if isinstance(config, PPOConfig):
        critic_path = config.ppo.critic_model_path or config.reward.model_path or config.model.path
        critic_model = load_value_model(config.model.model_copy(update={"lora": None}), critic_path,
                                        key="ppo.critic_model_path")
    open_outputs(context)
    seed_everything(config.train.seed + context.env.rank)  # ranks sample different responses
    total = total_optimizer_steps(config, context.env.world_size)
    actor = boost_component(context.booster, actor_model, config.optimizer, total)
    critic_booster = Booster(context.plugin, config.train.mixed_precision) if critic_model is not None else None
    critic = None
    if critic_model is not None:
        critic_optimizer_config = config.optimizer.model_copy(update={"lr": config.ppo.critic_lr})
        critic = boost_component(critic_booster, critic_model, critic_optimizer_config, total)
    checkpoints = CheckpointManager(context.checkpoint_root(), context.booster, config.checkpoint.keep_last,
                                    boosters={"critic": critic_booster} if critic_booster else None)
    return trainer_class(config)(
        context.booster, critic_booster, ReplayBuffer(), actor=actor, critic=critic, ref_model=reference,
        scorer=scorer, tokenizer=context.tokenizer, config=config, prompts=prompts, checkpoints=checkpoints,
        tracker=context.tracker, ptx_batches=ptx_batches, stop_after_episodes=stop_after_episodes)


def _ptx_batches(config: OnlineStageConfig, context: RunContext) -> list[dict]:
    if not isinstance(config, PPOConfig) or config.ppo.ptx_data_path is None:
        return []
    examples = load_sft_dataset(config.ppo.ptx_data_path, context.tokenizer, config.data.max_length,
                                config.data.skip_bad_rows).examples
    size = config.train.micro_batch_size
    return [pad_sft(examples[i:i + size], context.tokenizer.pad_token_id) for i in range(0, len(examples), size)]


def run_online_stage(config: OnlineStageConfig, stop_after_episodes: int | None = None) -> OnlineResult:
    """Train PPO or GRPO end to end: resume if possible, run episodes, export `<output_dir>/model`.

    Returns:
        Final metrics (with `eval/reward_before` and `eval/reward` when `data.eval_path` is set),
        the trained actor and, for PPO, the critic.
    """
    context = build_context(config)
    try:
        trainer = build_online_trainer(config, context, stop_after_episodes)
        eval_rows = None
        if config.data.eval_path:
            eval_rows = load_rows(config.data.eval_path, "prompt", skip_bad_rows=config.data.skip_bad_rows).examples
        latest = trainer.checkpoints.latest() if config.checkpoint.resume else None
        metrics: dict[str, float] = {}
        if latest is not None:
            trainer.restore(trainer.checkpoints.load(latest, trainer.components()))
        elif eval_rows:
            metrics["eval/reward_before"] = trainer.evaluate(eval_rows)
        options = trainer.options
        try:
            trainer.fit(options.num_episodes, options.num_collect_steps, options.num_update_epochs)
        except StopTraining as stop:
            logger.info("%s", stop)
            return OnlineResult(trainer.last_metrics, trainer.actor, trainer.critic)
        if eval_rows:
            metrics["eval/reward"] = trainer.evaluate(eval_rows)
        metrics.update(trainer.last_metrics, global_step=trainer.global_step, episodes=trainer.num_episodes_done)
        export_outputs(context, trainer, metrics)
        return OnlineResult(metrics, trainer.actor, trainer.critic)
    finally:
        context.tracker.close()


def export_outputs(context: RunContext, trainer: PPOTrainer, metrics: dict[str, float]) -> None:
    """Export the actor (and critic) as HF models, write final_metrics.json and samples, publish them."""
    exports = {"model": trainer.actor} | ({"critic": trainer.critic} if trainer.critic is not None else {})
    states = {name: context.booster.full_state_dict(model) for name, model in exports.items()}  # collectives
    context.tracker.log_metrics({k: v for k, v in metrics.items() if k.startswith("eval/")}, trainer.global_step)
    if context.env.is_main_process:
        lora = context.config.model.lora
        for name, model in exports.items():
            scale = lora.alpha / lora.r if lora and name == "model" else None
            export_model(unwrap_model(model), states[name], context.tokenizer, context.output_dir / name, lora_scale=scale)
        (context.output_dir / "final_metrics.json").write_text(json.dumps(metrics, indent=2))
        (context.output_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in trainer.samples))
        logger.info("model written to %s", join_uri(context.output_uri, "model"))
        context.tracker.log_model(context.output_dir / "model")
    publish_outputs(context, tuple(exports))
