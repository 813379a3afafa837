"""The run context every stage shares, and the three things every stage does with it.

`build_context` sets up the process group, plugin, booster, tokenizer and local work directory,
and vets `output_dir` before anything loads (a live lease, a finished run, a foreign checkpoint:
see `trainer.lifecycle.resume`); `open_outputs` takes the lease, records the config and starts tracking once
inputs have loaded; `resume_latest` restores the newest usable checkpoint (falling back past a
damaged one) and the metric history up to it; `finish_stage` refuses a non-finite model, exports
the trained model(s), writes `final_metrics.json` and publishes everything to a remote
`output_dir`; `close_context` ends tracking, releases the lease and the signal handlers. Supervised
and online stages all call these, so each happens in one place.

What a stage trains, and how, lives in `trainer/supervised/` and `trainer/online/`.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainer.checkpointing.checkpoint import CheckpointManager, one_line
from trainer.config import STAGE_CONFIGS, StageConfig, as_dict, dump_config
from trainer.data.dataset import LoadedDataset
from trainer.errors import AlignflowError, CheckpointError, ConfigError, TrainingError
from trainer.jsonio import dumps
from trainer.lifecycle import collector, preemption
from trainer.lifecycle.lease import Lease
from trainer.lifecycle.resume import METRICS_FILE, clear_outputs, restore_history, run_fingerprint, vet_output_dir
from trainer.modeling.models import export_model, load_tokenizer
from trainer.parallel.booster import Booster, Plugin, build_booster, unwrap_model
from trainer.parallel.plugins import make_plugin
from trainer.runtime import (
    DistributedEnv,
    any_rank_failed,
    configure_threads,
    init_process_group,
    pick_device,
    read_distributed_env,
)
from trainer.storage import get_storage, is_remote, join_uri
from trainer.storage.local import local_path
from trainer.storage.transfer import cache_root, upload_dir
from trainer.tracking.history import logged_at, loss_warnings, read_history
from trainer.tracking.tracker import NullTracker, Tracker, build_tracker, mlflow_run_id

logger = logging.getLogger(__name__)

# The small files a run leaves beside its model(s), published with them; `final_metrics.json` last,
# since its presence in `output_dir` marks the run finished.
RUN_FILES = ("config.yaml", "params.json", "metrics.jsonl", "mlflow_run.json", "samples.jsonl", "final_metrics.json")
# Errors of loading a checkpoint that mean "damaged": the loader falls back to the one before.
DAMAGED = (CheckpointError, OSError, EOFError, ValueError, KeyError, RuntimeError)
T = TypeVar("T")


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
    resume_from: list[str] = field(default_factory=list)
    """Complete checkpoints of this run to resume from, newest first (see `trainer.lifecycle.resume`)."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """The newest checkpoint's manifest (its MLflow run id is continued)."""
    fingerprint: dict[str, Any] | None = None
    """This run's fingerprint if vetting `output_dir` computed it (`trainer.lifecycle.resume.run_fingerprint`)."""
    lease: Lease | None = None
    skipped_rows: dict[str, int] = field(default_factory=dict)
    """Bad rows skipped under `data.skip_bad_rows`, per dataset (`train`, `eval`, `ptx`): see `examples_of`."""

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


def run_on_main(env: DistributedEnv, function: Callable[[], T]) -> T:
    """Run `function` on rank 0 only; every rank gets its result, or raises the AlignflowError it raised."""
    result, error = None, None
    if env.is_main_process:
        try:
            result = function()
        except AlignflowError as err:
            error = err
    if dist.is_initialized() and env.world_size > 1:
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
    if error is not None:
        raise error
    return result


def build_context(config: StageConfig) -> RunContext:
    """Join the process group, build plugin and booster, vet `output_dir`, then load the tokenizer."""
    env = read_distributed_env()
    device = pick_device(env)
    if config.model.lora is not None and config.parallel.plugin == "fsdp2":
        raise ConfigError("model.lora with parallel.plugin 'fsdp2' is not supported; use ddp for LoRA")
    init_process_group(env, device)
    configure_threads(config.train.num_threads)
    plugin = make_plugin(config.parallel, env, device, max_grad_norm=config.optimizer.max_grad_norm)
    booster = build_booster(plugin, config.train.mixed_precision)
    resume_from, manifest, fingerprint = run_on_main(env, lambda: _vet(config, booster))
    context = RunContext(config, env, plugin, booster, load_tokenizer(config.model.path), NullTracker(),
                         local_work_dir(config.output_dir), resume_from=resume_from, manifest=manifest,
                         fingerprint=fingerprint)
    preemption.install(config.checkpoint.preemption_grace_seconds)
    return context


def _vet(config: StageConfig, booster: Booster) -> tuple[list[str], dict[str, Any], dict[str, Any] | None]:
    """Fail at once if a live run holds `output_dir`; else what `trainer.lifecycle.resume.vet_output_dir` decides."""
    output_uri = config.output_dir.rstrip("/")
    Lease(output_uri, config.checkpoint.lease_timeout_seconds).check_free()
    checkpoints = CheckpointManager(join_uri(output_uri, "checkpoints"), booster)
    return vet_output_dir(config, stage_name(config), checkpoints, booster.plugin.world_size)


def examples_of(context: RunContext, name: str, loaded: LoadedDataset) -> list:
    """`loaded`'s examples; under `data.skip_bad_rows` its skipped rows become final metric `data/<name>_skipped`."""
    context.skipped_rows[name] = loaded.num_skipped
    return loaded.examples


def open_outputs(context: RunContext) -> None:
    """Take the lease on `output_dir` (clearing it first under `checkpoint.overwrite`), record the
    resolved config and start tracking (continuing the resumed attempt's MLflow run).

    Called only after the model and data loaded, so bad input leaves nothing behind.
    """
    config = context.config

    def claim() -> None:
        context.lease = Lease(context.output_uri, config.checkpoint.lease_timeout_seconds)
        context.lease.acquire()
        if config.checkpoint.overwrite:
            clear_outputs(context.output_uri)
            if is_remote(context.output_uri):
                (context.output_dir / METRICS_FILE).unlink(missing_ok=True)
        context.output_dir.mkdir(parents=True, exist_ok=True)
        dump_config(config, context.output_dir / "config.yaml")

    run_on_main(context.env, claim)
    context.tracker = build_tracker(context.output_dir, context.env.is_main_process, config.tracking,
                                    stage_name(config), resume_run_id=context.manifest.get("mlflow_run_id"))
    context.tracker.log_params(as_dict(config))
    collector.resume()  # the stage has started: every import and load is done (trainer.lifecycle.collector)


def resume_latest(context: RunContext, checkpoints: CheckpointManager, components: dict,
                  restore: Callable[[dict], None]) -> bool:
    """Restore the newest usable checkpoint (`build_context` vetted them) and the metric history up to it.

    A checkpoint that fails to load (a damaged file its manifest did not catch) is skipped with a
    warning for the one before; one that does not fit the model (shapes, names) is an error. Every
    checkpoint written from now on records the run's fingerprint, world size and MLflow run.

    Returns:
        True if a checkpoint was restored; False for a fresh start.
    """
    _stamp(context, checkpoints)
    errors = []
    for candidate in context.resume_from:
        state, error = _load_agreed(checkpoints, candidate, components)
        if error is not None:
            errors.append(f"{candidate}: {error}")
            logger.warning("checkpoint %s could not be loaded (%s); trying the one before", candidate, error)
            continue
        restore(state)
        checkpoints.last_durable = candidate
        if context.env.is_main_process:
            restore_history(context.output_uri, context.output_dir, candidate, int(state.get("global_step", 0)))
        return True
    if errors:
        raise CheckpointError(f"no checkpoint in {context.checkpoint_root()} could be loaded; newest: {errors[0]}")
    if context.env.is_main_process:
        restore_history(context.output_uri, context.output_dir, None, 0)
    return False


def _load_agreed(checkpoints: CheckpointManager, directory: str,
                 components: dict) -> tuple[dict | None, str | None]:
    """Load one checkpoint on every rank; (state, None), or (None, why) on every rank if any rank failed."""
    state, error = None, None
    try:
        state = checkpoints.load(directory, components)
    except DAMAGED as err:
        mismatch = next((line.strip() for line in str(err).splitlines()
                         if "size mismatch" in line or "Missing key" in line or "Unexpected key" in line), None)
        if mismatch:
            raise CheckpointError(f"{directory} does not fit the model being trained: {mismatch}") from err
        error = one_line(err)
    if any_rank_failed(error is not None, checkpoints.booster.plugin.device) and error is None:
        error = "another rank could not load it"
    return (state, None) if error is None else (None, error)


def _stamp(context: RunContext, checkpoints: CheckpointManager) -> None:
    """What every checkpoint of this run carries and does: its identity in the manifest, the metric
    history up to its step, and (remote output) publishing the run's files once it is complete."""
    if not context.env.is_main_process:
        return  # only rank 0 writes a manifest: the other ranks need not hash the data files
    fingerprint = context.fingerprint or run_fingerprint(context.config, stage_name(context.config))  # vetting's
    checkpoints.metadata = {"fingerprint": fingerprint,
                            "world_size": context.plugin.world_size,
                            "mlflow_run_id": mlflow_run_id(context.tracker)}
    metrics = context.output_dir / METRICS_FILE
    checkpoints.attachments = lambda: {METRICS_FILE: metrics.read_bytes()} if metrics.is_file() else {}
    if is_remote(context.output_uri):
        checkpoints.on_written = lambda directory: publish_run_files(context)


def finish_stage(context: RunContext, exports: dict[str, nn.Module], metrics: dict[str, float], step: int,
                 samples: list[dict] | None = None, loss_key: str | None = None) -> None:
    """Export each trained model (`{"model": actor, "critic": critic}`) as an HF directory, write
    `final_metrics.json` (and `samples.jsonl`), log eval metrics and the model, and publish.

    A model with a non-finite weight is never exported (TrainingError, nothing written). Metrics the
    caller does not have (a resume at the last step trains nothing) come from the run's history.
    With `loss_key`, a curve of that metric that did not fall, or grew by orders of magnitude, is
    logged as a warning and listed under `warnings` in the final metrics (`trainer.tracking.history`).
    Under `data.skip_bad_rows` the rows skipped per dataset are final metrics `data/<name>_skipped`.
    """
    states = {name: context.booster.full_state_dict(model) for name, model in exports.items()}  # collectives
    run_on_main(context.env, lambda: check_finite(states))
    if context.env.is_main_process:
        metrics = _final_metrics(context, metrics, step, loss_key)
        lora = context.config.model.lora
        for name, model in exports.items():
            scale = lora.alpha / lora.r if lora and name == "model" else None
            export_model(unwrap_model(model), states[name], context.tokenizer, context.output_dir / name,
                         lora_scale=scale)
        (context.output_dir / "final_metrics.json").write_text(dumps(metrics, indent=2))
        if samples is not None:
            (context.output_dir / "samples.jsonl").write_text("".join(dumps(s) + "\n" for s in samples))
        logger.info("model written to %s", join_uri(context.output_uri, "model"))
        context.tracker.log_model(context.output_dir / "model")
    publish_outputs(context, tuple(exports))


def _final_metrics(context: RunContext, metrics: dict[str, Any], step: int, loss_key: str | None) -> dict[str, Any]:
    """`metrics` completed from the history at `step`, with skipped-row counts and loss warnings (rank 0).

    Eval metrics the loop has not logged yet (the online stages' `eval/reward`) are logged at `step`.
    """
    history = read_history(context.output_dir / METRICS_FILE)
    logged = logged_at(history, step)
    evaluation = {key: value for key, value in metrics.items() if key.startswith("eval/") and key not in logged}
    if evaluation:
        context.tracker.log_metrics(evaluation, step)
    final = {**logged, **metrics}
    if context.config.data.skip_bad_rows:
        final.update({f"data/{name}_skipped": float(count) for name, count in context.skipped_rows.items()})
    warnings = loss_warnings(history, loss_key) if loss_key else []
    for warning in warnings:
        logger.warning("%s", warning)
    if warnings:
        final["warnings"] = warnings
    return final


def check_finite(states: dict[str, dict[str, torch.Tensor]]) -> None:
    """TrainingError naming the first tensor with NaN/inf values, if any (rank 0 holds full states)."""
    for name, state in states.items():
        bad = [key for key, tensor in state.items()
               if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all()]
        if bad:
            raise TrainingError(f"the trained {name} has non-finite (NaN/inf) values in {len(bad)} of {len(state)} "
                                f"tensors (first: {bad[0]}); it is not exported. Lower optimizer.lr or check the data")


def close_context(context: RunContext) -> None:
    """End tracking, release the lease on `output_dir` and restore the signal handlers (every exit path)."""
    collector.resume()  # setup may have failed before `open_outputs`
    try:
        context.tracker.close()
    finally:
        if context.lease is not None:
            context.lease.release()
            context.lease = None
        preemption.uninstall()


def publish_run_files(context: RunContext, names: tuple[str, ...] = ("config.yaml", "params.json", METRICS_FILE,
                                                                      "mlflow_run.json")) -> None:
    """Copy the run's small files (not the models) to a remote `output_dir` (rank 0)."""
    storage = get_storage(context.output_uri)
    for name in names:
        path = context.output_dir / name
        if path.is_file():
            storage.write_bytes(join_uri(context.output_uri, name), path.read_bytes())


def publish_outputs(context: RunContext, directories: tuple[str, ...] = ("model",)) -> None:
    """Copy the model to `export_dir` when one is set, else to a remote `output_dir`; other exported
    models (a PPO critic) and the run's small files go to a remote `output_dir` (rank 0)."""
    if not context.env.is_main_process:
        return
    if context.config.export_dir:
        upload_dir(context.output_dir / "model", context.config.export_dir.rstrip("/"))
        logger.info("model exported to %s", context.config.export_dir)
    if not is_remote(context.output_uri):
        return
    # With an export_dir the model is already there: one copy of the weights, not two.
    exported = ("model",) if context.config.export_dir else ()
    for name in directories:
        if name not in exported:
            upload_dir(context.output_dir / name, join_uri(context.output_uri, name))
    publish_run_files(context, RUN_FILES)
    logger.info("published outputs to %s", context.output_uri)
