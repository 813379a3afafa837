"""What an `output_dir` already holds, and whether this run may continue it.

Before a stage loads anything, `vet_output_dir` looks at the output directory and decides, with one
line when the answer is no:

- a finished run (`final_metrics.json` published) is not trained again (`RunFinished`, exit 0);
- with `checkpoint.resume: false`, a directory that holds a run's checkpoints or outputs is refused
  unless `checkpoint.overwrite: true` (then `clear_outputs` deletes them once the lease is held);
- the checkpoint to resume must belong to this run: its manifest's fingerprint (stage, base model,
  data by path and by content, the config keys that shape the run: see `run_fingerprint`) must
  match, and so must the
  data-parallel world size (the global batch and each rank's samples depend on it, so a changed
  world size is refused rather than resumed inexactly). One exception: a supervised run whose
  checkpoint is sharded (FSDP2, DCP; resharded on load) resumes on another world size when the run
  continues exactly: the global batch (micro_batch_size × gradient_accumulation_steps × processes)
  is unchanged, and under `train.group_by_length` so is micro_batch_size × processes (the sampler's
  length windows). The sampler's position is a count of samples, so each rank then skips its share.

`restore_history` makes `metrics.jsonl` continue from the resumed step: the checkpoint carries the
history up to its step, which replaces whatever a killed attempt appended after it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trainer.checkpointing.checkpoint import MANIFEST_FILE, STATE_FILE, CheckpointManager
from trainer.config import EvaluateConfig, StageConfig, as_dict
from trainer.errors import CheckpointError, ConfigError, RunFinished
from trainer.lifecycle.data_identity import content_identity
from trainer.storage import get_storage, is_remote, join_uri
from trainer.storage.local import directory_problem

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
FINAL_METRICS_FILE = "final_metrics.json"
# Config keys whose change makes a checkpoint belong to another run (besides the stage's own section).
SHAPING_KEYS = ("model.path", "model.lora", "data.train_path", "data.max_length", "train.seed",
                "train.micro_batch_size", "train.gradient_accumulation_steps", "reward")
# Keys of a stage section that may change between attempts: they lengthen or shorten the run.
LENGTH_KEYS = ("num_episodes",)
# Fingerprint entries `<data key>@content`: {file: identity of its bytes} (trainer/lifecycle/data_identity.py).
CONTENT_SUFFIX = "@content"


def _lookup(values: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(values, dict) or part not in values:
            return None
        values = values[part]
    return values


def run_fingerprint(config: StageConfig, stage: str) -> dict[str, Any]:
    """The identity of a run: its stage, base model, data and the config keys that shape its steps.

    The learning rate, intervals and run length are left out on purpose: resuming with a lower
    learning rate or for more steps is a normal thing to do.
    """
    values = as_dict(config)
    fingerprint: dict[str, Any] = {"stage": stage}
    for key in SHAPING_KEYS:
        if _lookup(values, key) is not None:
            fingerprint[key] = _lookup(values, key)
    section = values.get(stage) or {}
    for key, value in section.items():
        if key not in LENGTH_KEYS:
            fingerprint[f"{stage}.{key}"] = value
    for key in data_keys(fingerprint, stage):  # the data by content too: a file rewritten in place is other data
        fingerprint[key + CONTENT_SUFFIX] = content_identity(str(fingerprint[key]))
    return json.loads(json.dumps(fingerprint, sort_keys=True, default=str))


def data_keys(fingerprint: dict[str, Any], stage: str) -> list[str]:
    """The fingerprint's keys that name training data: `data.train_path` and a stage's `*data_path` (PPO's ptx)."""
    return [key for key, value in fingerprint.items() if isinstance(value, str) and value
            and (key == "data.train_path" or (key.startswith(f"{stage}.") and key.endswith("data_path")))]


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key is X there, Y here` for each key that differs (the stage first); for data content, the file.

    A content entry is compared only when both sides have one: checkpoints written before data was
    fingerprinted by content are compared by path, as they were.
    """
    keys = sorted(set(saved) | set(current), key=lambda key: (key != "stage", key))
    differences = []
    for key in keys:
        if key.endswith(CONTENT_SUFFIX):
            if key in saved and key in current:
                differences += _content_differences(key.removesuffix(CONTENT_SUFFIX), saved[key], current[key])
        elif saved.get(key) != current.get(key):
            differences.append(f"{key} is {saved.get(key)!r} there, {current.get(key)!r} here")
    return differences


def _content_differences(key: str, saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """One `<file> (<key>) changed since the checkpoint ...` per file whose bytes differ, is new or is gone."""
    if not saved or not current:
        return []  # one side could not be read: the path comparison (and the data loader) speak for it
    found = []
    for name in sorted(set(saved) | set(current)):
        before, now = saved.get(name), current.get(name)
        if before == now:
            continue
        if before is None:
            found.append(f"{name} ({key}) is new since the checkpoint")
        elif now is None:
            found.append(f"{name} ({key}) is gone since the checkpoint")
        else:
            found.append(f"{name} ({key}) changed since the checkpoint: {before[:19]}... there, {now[:19]}... here")
    return found


def existing_outputs(output_uri: str) -> list[str]:
    """What a previous run left in `output_uri`: checkpoints, metrics, a model (names, for messages)."""
    storage = get_storage(output_uri)
    found = []
    if storage.list(join_uri(output_uri, "checkpoints")):
        found.append("checkpoints")
    for name in (FINAL_METRICS_FILE, METRICS_FILE):
        if storage.exists(join_uri(output_uri, name)):
            found.append(name)
    return found


def check_output_directories(config: StageConfig | EvaluateConfig) -> None:
    """ConfigError naming the key if a local `output_dir` or `export_dir` is a file, or lies below one: the
    first write there would fail after the model and data loaded (or, for `export_dir`, after training)."""
    for key in ("output_dir", "export_dir"):
        uri = getattr(config, key, None)  # `evaluate` has no export_dir
        problem = directory_problem(uri) if uri and not is_remote(uri) else None
        if problem:
            raise ConfigError(f"{key}: {problem}")


def vet_output_dir(config: StageConfig, stage: str, checkpoints: CheckpointManager,
                   world_size: int) -> tuple[list[str], dict[str, Any], dict[str, Any] | None]:
    """Decide what this run does with what `output_dir` holds.

    Returns:
        The complete checkpoints to resume from, newest first ([] to start fresh), the manifest of
        the newest ({} when none), and this run's fingerprint when vetting computed it (None when
        there was no checkpoint to vet), so that the run's new manifests need not hash the data again.

    Raises:
        RunFinished: The directory holds a finished run and `checkpoint.resume` is on.
        ConfigError: `checkpoint.resume` is off, the directory holds a run, and `overwrite` is off; or
            `output_dir` or `export_dir` is a local file (`check_output_directories`).
        CheckpointError: The checkpoint belongs to another run or another world size, or none is usable.
    """
    check_output_directories(config)
    output_uri = config.output_dir.rstrip("/")
    options = config.checkpoint
    found = existing_outputs(output_uri)
    if not options.resume:
        if found and not options.overwrite:
            raise ConfigError(f"{output_uri} already holds a run ({', '.join(found)}) and checkpoint.resume is "
                              "false: set checkpoint.resume: true to continue it, or checkpoint.overwrite: true to "
                              "delete it and start over")
        return [], {}, None
    if FINAL_METRICS_FILE in found:
        raise RunFinished(f"{output_uri} already holds a finished {stage} run (its model is in "
                          f"{join_uri(output_uri, 'model')}); nothing to do. Use another output_dir to train again")
    if "checkpoints" not in found:
        return [], {}, None
    candidates = checkpoints.complete_checkpoints()
    if not candidates:
        return [], {}, None
    manifest = checkpoints.read_json(candidates[0], MANIFEST_FILE)
    fingerprint = run_fingerprint(config, stage)  # hashes every data file: computed once per run
    check_belongs(candidates[0], manifest, checkpoints.read_json(candidates[0], STATE_FILE), fingerprint, world_size,
                  group_by_length=getattr(config.train, "group_by_length", False))  # online stages have none
    return candidates, manifest, fingerprint


def check_belongs(directory: str, manifest: dict[str, Any], state: dict[str, Any], fingerprint: dict[str, Any],
                  world_size: int, group_by_length: bool = False) -> None:
    """CheckpointError (one line) unless the checkpoint was written by this run at this world size, or is
    sharded and resumes exactly at this one (see the module docstring)."""
    saved = manifest.get("fingerprint")
    saved_world = manifest.get("world_size", state.get("world_size"))
    resize = _resize_problem(manifest, state, saved, fingerprint, saved_world, world_size, group_by_length)
    if saved is not None:
        differences = fingerprint_differences(saved, fingerprint)
        if resize is not None and _is_reshardable(manifest, state, saved):  # the batch is judged as a whole below
            differences = [d for d in differences if not d.startswith(BATCH_KEYS)]
        if differences:
            more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
            raise CheckpointError(f"{directory} belongs to another run: {differences[0]}{more}; use another "
                                  "output_dir, or set checkpoint.resume: false and checkpoint.overwrite: true to "
                                  "start over")
    if resize:
        raise CheckpointError(f"{directory} was written by {saved_world} data-parallel process(es), this run has "
                              f"{world_size}: {resize}")


BATCH_KEYS = ("train.micro_batch_size", "train.gradient_accumulation_steps")


def _is_reshardable(manifest: dict[str, Any], state: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    """A sharded checkpoint of a supervised run (its position is a sample count), with a fingerprint."""
    from trainer.checkpointing.sharded import FORMAT as SHARDED_FORMAT  # here: it imports DCP (~50 MB)

    return manifest.get("format") == SHARDED_FORMAT and "samples_in_epoch" in state and saved is not None


def _resize_problem(manifest: dict[str, Any], state: dict[str, Any], saved: dict[str, Any] | None,
                    current: dict[str, Any], saved_world: Any, world_size: int, group_by_length: bool) -> str | None:
    """None: same world size. "": another world size that resumes exactly. Else why it would not."""
    if saved_world is None or int(saved_world) == world_size:
        return None
    saved_world = int(saved_world)
    if not _is_reshardable(manifest, state, saved):
        return (f"the global batch and each rank's samples would change, so it is not resumed; rerun with "
                f"{saved_world} process(es), or start a new output_dir")

    def sizes(fingerprint: dict[str, Any], world: int) -> tuple[int, int, int]:
        micro, accumulation = (int(fingerprint.get(key) or 1) for key in BATCH_KEYS)
        return micro, accumulation, micro * accumulation * world

    (micro, accumulation, batch), (new_micro, new_accumulation, new_batch) = sizes(saved, saved_world), sizes(
        current, world_size)
    if new_batch != batch:
        return (f"its global batch was {batch} (micro_batch_size {micro} x gradient_accumulation_steps "
                f"{accumulation} x {saved_world}), this run's is {new_batch} ({new_micro} x {new_accumulation} x "
                f"{world_size}); set train.micro_batch_size and train.gradient_accumulation_steps so it is {batch} "
                f"to resume this sharded checkpoint")
    if group_by_length and new_micro * world_size != micro * saved_world:
        return (f"with train.group_by_length, micro_batch_size x processes must stay {micro * saved_world} "
                f"(it is {new_micro * world_size}) so the samples are grouped the same way; scale "
                f"micro_batch_size, not gradient_accumulation_steps, with the process count")
    return ""


def clear_outputs(output_uri: str, exports: tuple[str, ...] = ("model", "critic")) -> None:
    """Delete what a previous run left (`checkpoint.overwrite`): checkpoints, run files, exported models."""
    storage = get_storage(output_uri)
    for name in ("checkpoints", *exports):
        directory = join_uri(output_uri, name)
        if is_remote(directory):
            for uri in storage.list(directory):
                storage.delete(uri)
        else:
            storage.delete(directory)
    for name in (METRICS_FILE, FINAL_METRICS_FILE, "samples.jsonl", "params.json", "mlflow_run.json"):
        storage.delete(join_uri(output_uri, name))
    logger.warning("checkpoint.overwrite: deleted the previous run's checkpoints and outputs in %s", output_uri)


def history_until(text: str, step: int) -> str:
    """The lines of a metrics.jsonl text logged at or before `step` (unparsable lines, e.g. a line cut
    by a kill, are dropped)."""
    kept = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line + "\n")
    return "".join(kept)


def restore_history(output_uri: str, local_dir: Path, checkpoint: str | None, step: int) -> None:
    """Make `<local_dir>/metrics.jsonl` the history up to `step`: the checkpoint's copy when it has one,
    else the published (or local) file cut at `step`; empty for a fresh start (rank 0)."""
    local = local_dir / METRICS_FILE
    history = ""
    if checkpoint is not None:
        saved = join_uri(checkpoint, METRICS_FILE)
        storage = get_storage(saved)
        if storage.exists(saved):
            history = history_until(storage.read_bytes(saved).decode(errors="replace"), step)
        else:
            published = join_uri(output_uri, METRICS_FILE)
            source = get_storage(published)
            text = source.read_bytes(published).decode(errors="replace") if source.exists(published) else ""
            if not text and local.is_file():
                text = local.read_text(errors="replace")
            history = history_until(text, step)
    local_dir.mkdir(parents=True, exist_ok=True)
    temporary = local.with_name(f".{METRICS_FILE}.tmp")
    temporary.write_text(history)
    temporary.replace(local)
