"""Building and running a supervised stage (sft, rm, dpo) from its config.

`build_context` does the setup every stage shares (process group, plugin, booster, tokenizer,
tracker, checkpoints); each `_prepare_<stage>` only picks its model, data, collate function and
objective; `run_stage` wires them into a `SupervisedTrainer`, resumes, trains and exports.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.algorithms.common import sequence_logps
from trainer.algorithms.dpo import DPOObjective
from trainer.algorithms.reward import RewardObjective
from trainer.algorithms.sft import SFTObjective
from trainer.algorithms.update import Objective, to_device
from trainer.booster import Booster, Plugin, make_plugin, unwrap_model
from trainer.checkpoint import CheckpointManager, TrainerState
from trainer.config import STAGE_CONFIGS, DPOConfig, RewardConfig, SFTConfig, StageConfig, as_dict, dump_config
from trainer.data.collate import pack_sft, pad_preference, pad_sft
from trainer.data.dataset import load_preference_dataset, load_sft_dataset
from trainer.errors import ConfigError
from trainer.models import export_model, load_causal_lm, load_tokenizer, load_value_model
from trainer.runtime import DistributedEnv, all_reduce_sum, init_process_group, pick_device, read_distributed_env
from trainer.storage import get_storage, is_remote, join_uri
from trainer.storage.local import local_path
from trainer.storage.transfer import cache_root, upload_dir
from trainer.supervised import StopTraining, SupervisedTrainer, total_steps
from trainer.tracking import NullTracker, Tracker, build_tracker

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RunContext:
    config: StageConfig
    env: DistributedEnv
    plugin: Plugin
    booster: Booster
    tokenizer: Any
    tracker: Tracker
    output_dir: Path
    """Local working directory: `config.output_dir` itself, or a cache folder when that is remote."""

    @property
    def output_uri(self) -> str:
        return self.config.output_dir.rstrip("/")

    def checkpoint_root(self) -> str:
        return join_uri(self.output_uri, "checkpoints")


def local_work_dir(output_uri: str) -> Path:
    """Where a run writes files before they are published to `output_uri`."""
    if not is_remote(output_uri):
        return local_path(output_uri)
    return cache_root() / "runs" / hashlib.sha256(output_uri.encode()).hexdigest()[:16]


def publish_outputs(context: RunContext, directories: tuple[str, ...] = ("model",)) -> None:
    """Copy the exported model(s) and the run's small files to a remote `output_dir`, and the model
    to `export_dir` when one is set (rank 0)."""
    if not context.env.is_main_process:
        return
    if context.config.export_dir:
        upload_dir(context.output_dir / "model", context.config.export_dir.rstrip("/"))
        logger.info("model exported to %s", context.config.export_dir)
    if not is_remote(context.output_uri):
        return
    for name in directories:
        upload_dir(context.output_dir / name, join_uri(context.output_uri, name))
    storage = get_storage(context.output_uri)
    for name in ("config.yaml", "params.json", "metrics.jsonl", "final_metrics.json", "mlflow_run.json",
                 "samples.jsonl"):
        if (context.output_dir / name).is_file():
            storage.upload_file(context.output_dir / name, join_uri(context.output_uri, name))
    logger.info("published outputs to %s", context.output_uri)


@dataclass(slots=True)
class StageResult:
    """What a finished (or stopped) stage leaves behind in the process: its metrics and trained model."""

    metrics: dict[str, float]
    model: nn.Module


@dataclass(slots=True)
class StageParts:
    model: nn.Module
    train_examples: list[dict]
    eval_examples: list[dict] | None
    collate: Callable[[list[dict]], dict]
    objective: Objective


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_context(config: StageConfig) -> RunContext:
    env = read_distributed_env()
    device = pick_device(env)
    if config.model.lora is not None and config.parallel.plugin == "fsdp2":
        raise ConfigError("model.lora with parallel.plugin 'fsdp2' is not supported; use ddp for LoRA")
    init_process_group(env, device)
    plugin = make_plugin(config.parallel.plugin, env, device)
    return RunContext(config, env, plugin, Booster(plugin, config.train.mixed_precision),
                      load_tokenizer(config.model.path), NullTracker(), local_work_dir(config.output_dir))


def open_outputs(context: RunContext) -> None:
    """Create the output directory, record the resolved config and start tracking.

    Called only after the model and data loaded, so bad input leaves nothing behind.
    """
    if context.env.is_main_process:
        context.output_dir.mkdir(parents=True, exist_ok=True)
        dump_config(context.config, context.output_dir / "config.yaml")
    stage = next(name for name, cls in STAGE_CONFIGS.items() if cls is type(context.config))
    context.tracker = build_tracker(context.output_dir, context.env.is_main_process, context.config.tracking, stage)
    context.tracker.log_params(as_dict(context.config))


# -- per-stage parts ----------------------------------------------------------------------------


def _load_split(loader: Callable, path: str | None, context: RunContext) -> list[dict] | None:
    if path is None:
        return None
    data = context.config.data
    return loader(path, context.tokenizer, data.max_length, data.skip_bad_rows).examples


def _prepare_sft(config: SFTConfig, context: RunContext) -> StageParts:
    pad_id = context.tokenizer.pad_token_id
    collate = pack_sft if config.sft.packing else functools.partial(pad_sft, pad_token_id=pad_id)
    # Data first: a bad row should fail before a large model spends time loading.
    train = _load_split(load_sft_dataset, config.data.train_path, context)
    evaluation = _load_split(load_sft_dataset, config.data.eval_path, context)
    return StageParts(load_causal_lm(config.model), train, evaluation, collate, SFTObjective())


def _prepare_rm(config: RewardConfig, context: RunContext) -> StageParts:
    collate = functools.partial(pad_preference, pad_token_id=context.tokenizer.pad_token_id)
    train = _load_split(load_preference_dataset, config.data.train_path, context)
    evaluation = _load_split(load_preference_dataset, config.data.eval_path, context)
    return StageParts(load_value_model(config.model), train, evaluation, collate,
                      RewardObjective(use_margin=config.rm.use_margin))


def _prepare_dpo(config: DPOConfig, context: RunContext) -> StageParts:
    options = config.dpo
    collate = functools.partial(pad_preference, pad_token_id=context.tokenizer.pad_token_id)
    train = _load_split(load_preference_dataset, config.data.train_path, context)
    evaluation = _load_split(load_preference_dataset, config.data.eval_path, context)
    reference = None
    if options.loss_type != "simpo" and not options.reference_free:
        reference = load_causal_lm(config.model.model_copy(update={"lora": None, "gradient_checkpointing": False}),
                                   options.ref_model_path, key="dpo.ref_model_path")
        reference.requires_grad_(False).eval().to(context.plugin.device)
        if options.precompute_ref_log_probs:
            for examples in (train, evaluation or []):
                _attach_reference_logps(reference, examples, collate, context)
            reference = None  # freed: the batches now carry the reference log-probs
    objective = DPOObjective(beta=options.beta, loss_type=options.loss_type, label_smoothing=options.label_smoothing,
                             simpo_gamma=options.simpo_gamma, ref_model=reference)
    return StageParts(load_causal_lm(config.model), train, evaluation, collate, objective)


@torch.no_grad()
def _attach_reference_logps(reference: nn.Module, examples: list[dict], collate: Callable, context: RunContext) -> None:
    """Score every pair once with the reference; ranks split the work and share results by all-reduce."""
    size, world, rank = len(examples), context.env.world_size, context.env.rank
    scores = torch.zeros(2, size, dtype=torch.float64, device=context.plugin.device)  # (chosen|rejected, N)
    batch_size = context.config.train.micro_batch_size
    mine = list(range(rank, size, world))
    for start in range(0, len(mine), batch_size):
        indices = mine[start:start + batch_size]
        batch = to_device(collate([examples[i] for i in indices]), context.plugin.device)
        logits = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        chosen, rejected = sequence_logps(logits, batch["labels"])[0].chunk(2)
        scores[0, indices], scores[1, indices] = chosen.double(), rejected.double()
    all_reduce_sum(scores)
    for index, example in enumerate(examples):
        example["ref_chosen_logps"], example["ref_rejected_logps"] = scores[:, index].tolist()


PREPARE: dict[type, Callable[[Any, RunContext], StageParts]] = {
    SFTConfig: _prepare_sft,
    RewardConfig: _prepare_rm,
    DPOConfig: _prepare_dpo,
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
    from trainer.optim import build_optimizer, build_scheduler

    context = build_context(config)
    try:
        seed_everything(config.train.seed)
        parts = PREPARE[type(config)](config, context)
        open_outputs(context)
        model, *_ = context.booster.boost(parts.model)
        optimizer = build_optimizer(model, config.optimizer)
        context.booster.register_optimizer(model, optimizer)
        train = config.train
        steps = total_steps(train, len(parts.train_examples), context.env.world_size)
        scheduler = build_scheduler(optimizer, config.optimizer, steps)
        checkpoints = CheckpointManager(context.checkpoint_root(), context.booster, config.checkpoint.keep_last)
        trainer = SupervisedTrainer(
            context.booster, train.max_epochs, model, optimizer, context.plugin, scheduler=scheduler,
            objective=parts.objective, config=config, train_examples=parts.train_examples,
            eval_examples=parts.eval_examples, collate=parts.collate, checkpoints=checkpoints,
            tracker=context.tracker, stop_after_steps=stop_after_steps)
        latest = checkpoints.latest() if config.checkpoint.resume else None
        if latest is not None:
            trainer.restore(TrainerState(**checkpoints.load(latest, trainer.components())))
        try:
            trainer.fit()
        except StopTraining as stop:
            logger.info("%s", stop)
            return StageResult(trainer.last_metrics, model)
        return StageResult(_finish(context, model, trainer), model)
    finally:
        context.tracker.close()


def _finish(context: RunContext, model: nn.Module, trainer: SupervisedTrainer) -> dict[str, float]:
    """Export the HF model to `<output_dir>/model` and write `final_metrics.json` (rank 0)."""
    state = context.booster.full_state_dict(model)  # a collective: every rank takes part
    metrics = {**trainer.last_metrics, **trainer.eval_metrics, "global_step": trainer.global_step}
    if context.env.is_main_process:
        lora = context.config.model.lora
        export_model(unwrap_model(model), state, context.tokenizer, context.output_dir / "model",
                     lora_scale=lora.alpha / lora.r if lora else None)
        (context.output_dir / "final_metrics.json").write_text(json.dumps(metrics, indent=2))
        logger.info("model written to %s", join_uri(context.output_uri, "model"))
        context.tracker.log_metrics({k: v for k, v in metrics.items() if k.startswith("eval/")}, trainer.global_step)
        context.tracker.log_model(context.output_dir / "model")
    publish_outputs(context)
    return metrics
