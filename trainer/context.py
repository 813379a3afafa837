"""The run context every stage shares, and the three things every stage does with it.

`build_context` sets up the process group, plugin, booster, tokenizer and local work directory;
`open_outputs` records the config and starts tracking once inputs have loaded; `resume_latest`
restores the newest checkpoint when resuming is on; `finish_stage` exports the trained model(s),
writes `final_metrics.json` and publishes everything to a remote `output_dir`. Supervised and
online stages both call these, so each happens in one place.

What a stage trains, and how, lives in `trainer/supervised/` and `trainer/online/`.
"""

from __future__ import annotations

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

from trainer.booster import Booster, Plugin, make_plugin, unwrap_model
from trainer.checkpoint import CheckpointManager
from trainer.config import STAGE_CONFIGS, StageConfig, as_dict, dump_config
from trainer.errors import ConfigError
from trainer.models import export_model, load_tokenizer
from trainer.runtime import DistributedEnv, init_process_group, pick_device, read_distributed_env
from trainer.storage import get_storage, is_remote, join_uri
from trainer.storage.local import local_path
from trainer.storage.transfer import cache_root, upload_dir
from trainer.tracking.tracker import NullTracker, Tracker, build_tracker

logger = logging.getLogger(__name__)

# The small files a run leaves beside its model(s), published with them.
RUN_FILES = ("config.yaml", "params.json", "metrics.jsonl", "final_metrics.json", "mlflow_run.json", "samples.jsonl")


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def stage_name(config: StageConfig) -> str:
    return next(name for name, cls in STAGE_CONFIGS.items() if cls is type(config))


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
    context.tracker = build_tracker(context.output_dir, context.env.is_main_process, context.config.tracking,
                                    stage_name(context.config))
    context.tracker.log_params(as_dict(context.config))


def resume_latest(context: RunContext, checkpoints: CheckpointManager, components: dict,
                  restore: Callable[[dict], None]) -> bool:
    """Restore the newest complete checkpoint when `checkpoint.resume` is on; True if one was restored."""
    latest = checkpoints.latest() if context.config.checkpoint.resume else None
    if latest is None:
        return False
    restore(checkpoints.load(latest, components))
    return True


def finish_stage(context: RunContext, exports: dict[str, nn.Module], metrics: dict[str, float], step: int,
                 samples: list[dict] | None = None) -> None:
    """Export each trained model (`{"model": actor, "critic": critic}`) as an HF directory, write
    `final_metrics.json` (and `samples.jsonl`), log eval metrics and the model, and publish."""
    states = {name: context.booster.full_state_dict(model) for name, model in exports.items()}  # collectives
    context.tracker.log_metrics({k: v for k, v in metrics.items() if k.startswith("eval/")}, step)
    if context.env.is_main_process:
        lora = context.config.model.lora
        for name, model in exports.items():
            scale = lora.alpha / lora.r if lora and name == "model" else None
            export_model(unwrap_model(model), states[name], context.tokenizer, context.output_dir / name,
                         lora_scale=scale)
        (context.output_dir / "final_metrics.json").write_text(json.dumps(metrics, indent=2))
        if samples is not None:
            (context.output_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        logger.info("model written to %s", join_uri(context.output_uri, "model"))
        context.tracker.log_model(context.output_dir / "model")
    publish_outputs(context, tuple(exports))


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
    for name in RUN_FILES:
        if (context.output_dir / name).is_file():
            storage.upload_file(context.output_dir / name, join_uri(context.output_uri, name))
    logger.info("published outputs to %s", context.output_uri)
