"""Building and running a supervised stage (sft, rm, dpo, kto, orpo) from its config.

`trainer.lifecycle.context` does the setup every stage shares (process group, plugin, booster, tokenizer,
tracker, resume, export); each `_prepare_<stage>` only picks its model, data, collate function and
objective; `run_stage` wires them into a `SupervisedTrainer`, resumes, trains and exports.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.algorithms.dpo import DPOObjective, preference_logps
from trainer.algorithms.kto import KTOObjective
from trainer.algorithms.orpo import ORPOObjective
from trainer.algorithms.reward import RewardObjective
from trainer.algorithms.sft import SFTObjective
from trainer.algorithms.update import Objective, to_device
from trainer.base import StopTraining
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.config import DPOConfig, KTOConfig, ORPOConfig, RewardConfig, SFTConfig, StageConfig
from trainer.data.collate import (
    pack_or_share_preference,
    pack_preference,
    pack_sft,
    pad_preference,
    pad_sft,
    pad_unpaired,
)
from trainer.data.dataset import load_preference_dataset, load_sft_dataset, load_unpaired_dataset
from trainer.errors import TrainingError
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
from trainer.modeling.attention import use_varlen_attention
from trainer.modeling.models import load_causal_lm, load_frozen, load_value_model
from trainer.modeling.shared_prompts import shares_prompts
from trainer.runtime import all_reduce_sum
from trainer.supervised.loop import SupervisedTrainer, total_steps

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StageResult:
    """What a finished (or stopped) stage leaves behind in the process: its metrics and trained model."""

    metrics: dict[str, float]
    model: nn.Module
    stopped: str | None = None
    """Why the stage stopped before its end (a signal, `--stop-after-steps`), else None. A stopped stage's
    metrics are its last step's: it was not evaluated."""


@dataclass(slots=True)
class StageParts:
    model: nn.Module
    train_examples: list[dict]
    eval_examples: list[dict] | None
    collate: Callable[[list[dict]], dict]
    objective: Objective


# -- per-stage parts ----------------------------------------------------------------------------


def _load_split(loader: Callable, name: str, context: RunContext) -> list[dict] | None:
    """The `train` or `eval` split (`data.<name>_path`), or None when that path is unset."""
    data = context.config.data
    path = getattr(data, f"{name}_path")
    if path is None:
        return None
    return examples_of(context, name, loader(path, context.tokenizer, data.max_length, data.skip_bad_rows))


def _prepare_sft(config: SFTConfig, context: RunContext) -> StageParts:
    pad_id = context.tokenizer.pad_token_id
    collate = functools.partial(pack_sft if config.sft.packing else pad_sft, pad_token_id=pad_id)
    # Data first: a bad row should fail before a large model spends time loading.
    train = _load_split(load_sft_dataset, "train", context)
    evaluation = _load_split(load_sft_dataset, "eval", context)
    return StageParts(load_causal_lm(config.model, plugin=context.plugin), train, evaluation, collate, SFTObjective())


def _preference_collate(packing: bool, context: RunContext, share_prompts: bool = False) -> Callable[[list[dict]], dict]:
    """Packed rows, padded rows, or (packing with shared prompts) whichever of the two computes less per batch."""
    collate = (pack_or_share_preference if packing and share_prompts else pack_preference if packing
               else pad_preference)
    return functools.partial(collate, pad_token_id=context.tokenizer.pad_token_id)


def _preference_data(packing: bool, context: RunContext,
                     share_prompts: bool = False) -> tuple[Callable, list, list | None]:
    """The collate function and the train and eval pairs of a preference stage (rm, dpo, orpo)."""
    return (_preference_collate(packing, context, share_prompts), _load_split(load_preference_dataset, "train", context),
            _load_split(load_preference_dataset, "eval", context))


def _may_share_prompts(config: StageConfig) -> bool:
    """Whether the policy's forward can run a shared prompt once (`trainer.modeling.shared_prompts.shares_prompts`
    tells for sure at each call): not under FSDP2 or ColossalAI, not with gradient checkpointing."""
    return config.parallel.plugin in ("auto", "single", "ddp") and not config.model.gradient_checkpointing


def _prepare_rm(config: RewardConfig, context: RunContext) -> StageParts:
    collate, train, evaluation = _preference_data(config.rm.packing, context)
    model = load_value_model(config.model, plugin=context.plugin)
    if config.rm.packing:
        use_varlen_attention(model)
    return StageParts(model, train, evaluation, collate, RewardObjective(use_margin=config.rm.use_margin))


def _load_reference(config: DPOConfig | KTOConfig, path: str | None, key: str, context: RunContext,
                    sharded: bool = True) -> nn.Module:
    """The frozen reference policy (`path`, default `model.path`). Sharded under FSDP2 when it runs beside the
    policy (every rank, every step: its all-gathers line up); `sharded=False` loads it whole."""
    return load_frozen(load_causal_lm, config.model, context.plugin.device, path, key=key,
                       plugin=context.plugin if sharded else None)


def _prepare_dpo(config: DPOConfig, context: RunContext) -> StageParts:
    options = config.dpo
    share_prompts = options.share_prompts and _may_share_prompts(config)
    collate, train, evaluation = _preference_data(options.packing, context, share_prompts)
    reference = None
    if options.needs_reference:
        # Precomputing splits the pairs unevenly across ranks, so that reference loads whole.
        reference = _load_reference(config, options.ref_model_path, "dpo.ref_model_path", context,
                                    sharded=not options.precompute_ref_log_probs)
        if options.packing:
            use_varlen_attention(reference)
        if options.precompute_ref_log_probs:
            for examples in (train, evaluation or []):
                _attach_reference_logps(reference, examples, collate, context, share_prompts)
            reference = None  # freed: the batches now carry the reference log-probs
    objective = DPOObjective(beta=options.beta, loss_type=options.loss_types, loss_weights=options.loss_weights,
                             label_smoothing=options.label_smoothing, simpo_gamma=options.simpo_gamma,
                             discopop_tau=options.discopop_tau, rpo_alpha=options.rpo_alpha, ref_model=reference,
                             share_prompts=share_prompts)
    model = load_causal_lm(config.model, plugin=context.plugin)
    if share_prompts and not shares_prompts(model):  # a sliding window, sharded weights: every sequence whole
        collate, objective.share_prompts = _preference_collate(options.packing, context), False
    if options.packing:
        use_varlen_attention(model)
    return StageParts(model, train, evaluation, collate, objective)


def _prepare_kto(config: KTOConfig, context: RunContext) -> StageParts:
    options = config.kto
    collate = functools.partial(pad_unpaired, pad_token_id=context.tokenizer.pad_token_id,
                                max_length=config.data.max_length)
    train = _load_split(load_unpaired_dataset, "train", context)
    evaluation = _load_split(load_unpaired_dataset, "eval", context)
    reference = _load_reference(config, options.ref_model_path, "kto.ref_model_path", context)
    objective = KTOObjective(beta=options.beta, ref_model=reference, loss_type=options.loss_type,
                             desirable_weight=options.desirable_weight, undesirable_weight=options.undesirable_weight)
    return StageParts(load_causal_lm(config.model, plugin=context.plugin), train, evaluation, collate, objective)


def _prepare_orpo(config: ORPOConfig, context: RunContext) -> StageParts:
    collate, train, evaluation = _preference_data(config.orpo.packing, context)
    model = load_causal_lm(config.model, plugin=context.plugin)
    if config.orpo.packing:
        use_varlen_attention(model)
    return StageParts(model, train, evaluation, collate, ORPOObjective(beta=config.orpo.beta))


@torch.no_grad()
def _attach_reference_logps(reference: nn.Module, examples: list[dict], collate: Callable, context: RunContext,
                            share_prompts: bool = False) -> None:
    """Score every pair once with the reference; ranks split the work and share results by all-reduce."""
    size, world, rank = len(examples), context.env.world_size, context.env.rank
    scores = torch.zeros(2, size, dtype=torch.float64, device=context.plugin.device)  # (chosen|rejected, N)
    batch_size = context.config.train.micro_batch_size
    mine = list(range(rank, size, world))
    for start in range(0, len(mine), batch_size):
        indices = mine[start:start + batch_size]
        batch = to_device(collate([examples[i] for i in indices]), context.plugin.device)
        chosen, rejected = preference_logps(reference, batch, share_prompts=share_prompts)[0].chunk(2)
        scores[0, indices], scores[1, indices] = chosen.double(), rejected.double()
    all_reduce_sum(scores)
    for index, example in enumerate(examples):
        example["ref_chosen_logps"], example["ref_rejected_logps"] = scores[:, index].tolist()


PREPARE: dict[type, Callable[[Any, RunContext], StageParts]] = {
    SFTConfig: _prepare_sft,
    RewardConfig: _prepare_rm,
    DPOConfig: _prepare_dpo,
    KTOConfig: _prepare_kto,
    ORPOConfig: _prepare_orpo,
}


# -- the run ------------------------------------------------------------------------------------


def run_stage(config: StageConfig, stop_after_steps: int | None = None) -> StageResult:
    """Train a supervised stage end to end: resume if possible, train, export `<output_dir>/model`.

    Args:
        config: The stage's validated config.
        stop_after_steps: Save and return after this optimizer step (a simulated preemption).

    Returns:
        The final metrics (also written to `final_metrics.json`) and the trained (boosted) model.
    """
    from trainer.modeling.optim import build_optimizer, build_scheduler

    context = build_context(config)
    try:
        seed_everything(config.train.seed)
        parts = PREPARE[type(config)](config, context)
        open_outputs(context)
        train = config.train
        steps = total_steps(train, len(parts.train_examples), context.plugin.world_size)
        model, optimizer, scheduler = context.booster.boost_with_optimizer(
            parts.model, lambda model: build_optimizer(model, config.optimizer),
            lambda optimizer: build_scheduler(optimizer, config.optimizer, steps))
        checkpoints = CheckpointManager(context.checkpoint_root(), context.booster, config.checkpoint.keep_last)
        trainer = SupervisedTrainer(
            context.booster, train.max_epochs, model, optimizer, context.plugin, scheduler=scheduler,
            objective=parts.objective, config=config, train_examples=parts.train_examples,
            eval_examples=parts.eval_examples, collate=parts.collate, checkpoints=checkpoints,
            tracker=context.tracker, stop_after_steps=stop_after_steps)
        resume_latest(context, checkpoints, trainer.components(), lambda state: trainer.restore(TrainerState(**state)))
        try:
            trainer.fit()
        except StopTraining as stop:
            logger.warning("%s; not evaluated", stop)
            return StageResult(trainer.last_metrics, model, stopped=str(stop))
        # Every epoch trained here ends with an evaluation (a resume after the last epoch trains none; its final
        # metrics come from the history): evaluation data without evaluation metrics is a loop bug, said out loud.
        if parts.eval_examples and not trainer.eval_metrics and trainer.start_epoch < trainer.max_epochs:
            raise TrainingError(f"{config.data.eval_path}: {len(parts.eval_examples)} evaluation examples were "
                                f"loaded but no evaluation ran after {trainer.global_step} steps")
        metrics = {**trainer.last_metrics, **trainer.eval_metrics, "global_step": trainer.global_step}
        finish_stage(context, {"model": model}, metrics, trainer.global_step, loss_key="loss")
        return StageResult(metrics, model)
    finally:
        close_context(context)

