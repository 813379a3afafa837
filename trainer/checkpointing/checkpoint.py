"""Atomic, resumable checkpoints under `<output_dir>/checkpoints/`.

(Over 300 lines: writing, finding and vetting a checkpoint share one layout, kept in one place.)

The checkpoint root is a local path or an `s3://` URI (through `trainer.storage`).
Layout of one checkpoint, `step-00000042/`: for each trained component NAME (`model` for the
supervised stages, `actor` and `critic` for PPO) `NAME.pt`, `NAME.optimizer.pt` and
`NAME.scheduler.pt` (full state dicts, see `Booster`; under FSDP2 the model and optimizer are
a directory of DCP shards `NAME.dcp/` instead, written by every rank with no gather, see
`trainer.checkpointing.sharded_checkpoints`); `rng-rank<R>.safetensors` (each rank's
torch/CUDA RNG states as tensors, its python/numpy states as JSON metadata); and
`trainer_state.json` (the loop position), written last as the checkpoint's completion marker.
Only then does rank 0 replace the `latest` pointer (atomically),
so a reader never picks up a half-written checkpoint; a crash or a failed upload mid-save leaves
the previous `latest`. Older checkpoints are deleted only after a newer one is complete.

Beside the state files, `manifest.json` (written before the marker) records every file's size and
what the checkpoint belongs to (`metadata`: the run's fingerprint, world size, MLflow run id), and
`attachments` (the run's `metrics.jsonl` up to this step) are stored as plain files. A checkpoint
whose files do not match its manifest (truncated, missing) is skipped by `complete_checkpoints`
in favour of the previous complete one. A background save that fails is reported in one line and
written again at the next save; a blocking save that fails names the last durable checkpoint.

Checkpoints sit where others can write, so resuming unpickles nothing (see `trainer.checkpointing.serialization`):
the state dicts are read with `torch.load(weights_only=True)`, the rest as safetensors and JSON, and
a file that is not what its name says is a `CheckpointError` naming it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.checkpointing.common import (  # noqa: F401 - re-exported: callers import them from here
    LATEST,
    MANIFEST_FILE,
    STATE_FILE,
    STEP_NAME,
    ModelParts,
    copy_tensors,
    gather_objects,
    one_line,
)
from trainer.checkpointing.rng_state import (  # noqa: F401 - re-exported: the RNG file is part of this layout
    capture_rng_state,
    decode_rng_state,
    encode_rng_state,
    restore_rng_state,
    rng_state_file,
)
from trainer.checkpointing.serialization import load_json, refusing_pickled_objects
from trainer.checkpointing.sharded_checkpoints import ShardedCheckpoints
from trainer.errors import CheckpointError, StorageError
from trainer.jsonio import dumps
from trainer.parallel.booster import Booster
from trainer.runtime import barrier
from trainer.storage import get_storage, join_uri
from trainer.storage.base import is_remote
from trainer.storage.pointer import read_pointer, write_pointer
from trainer.storage.transfer import download_prefix, upload_dir

logger = logging.getLogger(__name__)

@dataclass(slots=True)
class TrainerState:
    """Where the loop stands: the next epoch to run and how far into it the run got."""

    epoch: int = 0
    global_step: int = 0
    samples_in_epoch: int = 0
    """Samples of `epoch` already consumed, summed over all ranks."""
    world_size: int = 1
    num_nonfinite_skipped: int = 0
    """Optimizer steps skipped so far for a non-finite loss or gradient norm."""
    nonfinite_in_a_row: int = 0
    """How many of the latest steps in a row were skipped (a run that ends in such a streak is not exported)."""


class CheckpointManager(ShardedCheckpoints):
    """Saves and finds checkpoints of one run.

    Args:
        root: The run's checkpoint directory: a local path or an `s3://` URI.
        booster: Writes model/optimizer/scheduler state for the run's plugin.
        keep_last: Number of complete checkpoints to keep (0 keeps all).
        boosters: Per-component boosters where they differ from `booster` (e.g. the critic's).
    """

    def __init__(self, root: str | Path, booster: Booster, keep_last: int = 0,
                 boosters: dict[str, Booster] | None = None) -> None:
        self.root = str(root).rstrip("/")
        self.storage = get_storage(self.root)
        self.booster = booster
        self.keep_last = keep_last
        self.boosters = dict(boosters or {})
        self.is_main_process = booster.plugin.is_main_process
        self._pending: threading.Thread | None = None
        self.metadata: dict[str, Any] = {}
        """What every checkpoint records in its manifest (fingerprint, world size, MLflow run id)."""
        self.attachments: Callable[[], dict[str, bytes]] | None = None
        """Small files stored as they are in every checkpoint (rank 0), e.g. the metrics so far."""
        self.on_written: Callable[[str], None] | None = None
        """Called with a checkpoint's URI once it is complete and `latest` (rank 0, maybe on the writer thread)."""
        self.last_durable: str | None = None
        """The newest checkpoint known to be complete: written by this run or resumed from."""
        self._failed: tuple[dict[str, Any], int] | None = None  # a background save that failed, kept for a retry
        self._error: Exception | None = None  # its error, raised once by `wait`
        self.shard_files_read: dict[str, list[str]] = {}
        """Per component, the files of its DCP directory this rank read at the last sharded load."""

    def latest(self) -> str | None:
        """The newest complete checkpoint (see `complete_checkpoints`), or None."""
        candidates = self.complete_checkpoints()
        return candidates[0] if candidates else None

    def complete_checkpoints(self) -> list[str]:
        """Complete checkpoints up to the one `latest` names, newest first; [] without a `latest` pointer.

        Complete means: the marker is there and parses, every file of the manifest is there with its
        recorded size, and no other file is. A damaged one (truncated, missing or foreign file) is
        skipped with a warning, so a resume falls back to the previous complete one that `keep_last`
        kept; when none is left, that is a CheckpointError naming what is wrong with the latest.
        """
        name = read_pointer(self.storage, self.root, LATEST, STEP_NAME)  # never `../other-run`
        if name is None:
            return []
        names = sorted({n for n in self._step_names() if STEP_NAME.fullmatch(n) and n <= name} | {name}, reverse=True)
        complete, problems = [], []
        for candidate in names:
            directory = join_uri(self.root, candidate)
            problem = self.check_files(directory)
            if problem is None:
                complete.append(directory)
            elif not complete:
                problems.append(problem)
                logger.warning("checkpoint %s is not usable (%s); falling back to the one before", directory, problem)
        if not complete:
            raise CheckpointError(f"{join_uri(self.root, LATEST)} names {name}, but no checkpoint up to it is usable: {problems[0]}")
        return complete

    def check_files(self, directory: str) -> str | None:
        """None if `directory` is a complete checkpoint, else what is wrong with it."""
        try:
            state_uri = join_uri(directory, STATE_FILE)
            if not self.storage.exists(state_uri):
                return f"{state_uri} is missing: the save never finished"
            load_json(self.storage.read_bytes(state_uri), state_uri, CheckpointError)
            manifest_uri = join_uri(directory, MANIFEST_FILE)
            if not self.storage.exists(manifest_uri):
                return None  # written before manifests existed: the marker is all there is to check
            files = load_json(self.storage.read_bytes(manifest_uri), manifest_uri, CheckpointError).get("files", {})
            present = set(self.storage.list(directory))
            for name, size in files.items():
                uri = join_uri(directory, name)
                if uri not in present and not self.storage.exists(uri):  # local listings hide dot files (DCP's .metadata)
                    return f"{uri} is missing"
                if self.storage.size(uri) != size:
                    return f"{uri} has {self.storage.size(uri)} bytes, its manifest says {size}"
            expected = {join_uri(directory, name) for name in files} | {state_uri, manifest_uri}
            foreign = sorted(present - expected)
            if foreign:
                return f"{foreign[0]} is not part of the checkpoint (not in its manifest)"
        except CheckpointError as err:
            return str(err)
        return None

    def read_json(self, directory: str, name: str) -> dict[str, Any]:
        """A JSON file of a checkpoint (`trainer_state.json`, `manifest.json`); {} when absent."""
        uri = join_uri(directory, name)
        if not self.storage.exists(uri):
            return {}
        return load_json(self.storage.read_bytes(uri), uri, CheckpointError)

    def snapshot(self, components: dict[str, ModelParts], state: TrainerState | dict,
                 copy: bool = False) -> dict[str, Any]:
        """Gather everything a checkpoint holds onto rank 0's CPU (a collective: every rank calls it).

        Args:
            components: name -> (model, optimizer, scheduler).
            state: The loop position, a dataclass or a JSON-able dict.
            copy: Clone tensors, so training may go on while a background thread writes them.

        Returns:
            File name -> object, plus the JSON state; complete on rank 0 only.
        """
        files: dict[str, Any] = {}
        for name, (model, optimizer, scheduler) in components.items():
            booster = self.boosters.get(name, self.booster)
            files[f"{name}.pt"] = booster.full_state_dict(model)
            files[f"{name}.optimizer.pt"] = booster.full_optimizer_state_dict(optimizer)
            files[f"{name}.scheduler.pt"] = scheduler.state_dict()
        for rank, rng_state in enumerate(gather_objects(capture_rng_state())):
            files[rng_state_file(rank)] = encode_rng_state(rng_state)
        if copy:
            files = copy_tensors(files)
        raw = self.attachments() if self.attachments is not None and self.is_main_process else {}
        return {"files": files, "state": state if isinstance(state, dict) else asdict(state), "raw": raw}

    def write(self, snapshot: dict[str, Any], step: int) -> str:
        """Write a snapshot as `step-<step>`, marker last, then point `latest` at it. Rank 0; no collectives."""
        name = f"step-{step:08d}"
        directory = join_uri(self.root, name)
        with tempfile.TemporaryDirectory(prefix="alignflow-checkpoint-") as staging_root:
            staging = Path(staging_root) / name
            staging.mkdir()
            for file_name, payload in snapshot["files"].items():
                if isinstance(payload, bytes):  # already serialized (RNG states)
                    (staging / file_name).write_bytes(payload)
                else:
                    torch.save(payload, staging / file_name)
            (staging / STATE_FILE).write_text(dumps(snapshot["state"]))
            self._write_extras(staging, snapshot.get("raw", {}))
            self._remove(directory)  # left by a crash before its `latest` was written
            upload_dir(staging, directory, skip=(STATE_FILE,))
            self.storage.upload_file(staging / STATE_FILE, join_uri(directory, STATE_FILE))
        return self._publish(name)

    def _publish(self, name: str) -> str:
        """Point `latest` at the complete checkpoint `name`, apply retention, tell `on_written` (rank 0)."""
        directory = join_uri(self.root, name)
        write_pointer(self.storage, self.root, LATEST, name)
        self.last_durable = directory
        self._apply_retention(name)
        logger.info("saved checkpoint %s", directory)
        if self.on_written is not None:
            try:
                self.on_written(directory)
            except Exception as err:  # noqa: BLE001 - publishing is best effort; the checkpoint is complete
                logger.warning("checkpoint %s is complete, but publishing beside it failed: %s", directory, err)
        return directory

    def _write_extras(self, staging: Path, raw: dict[str, bytes], uploaded: dict[str, int] | None = None,
                      **fields: Any) -> None:
        """The attachments as plain files, then the manifest: sizes of every file but the marker (those
        in staging and the `uploaded` ones other ranks wrote), the run's metadata and `fields`."""
        for file_name, data in raw.items():
            (staging / file_name).write_bytes(data)
        sizes = {p.relative_to(staging).as_posix(): p.stat().st_size for p in sorted(staging.rglob("*"))
                 if p.is_file() and p.name != STATE_FILE}
        sizes = dict(sorted({**sizes, **(uploaded or {})}.items()))
        (staging / MANIFEST_FILE).write_text(dumps({"files": sizes, **self.metadata, **fields}, indent=1))

    def _write_or_record(self, snapshot: dict[str, Any], step: int) -> None:
        """Background save: a failure is logged in one line and kept, to be written again at the next save."""
        try:
            self.write(snapshot, step)
        except Exception as err:  # noqa: BLE001 - kept, and raised by `wait`
            self._failed, self._error = (snapshot, step), err
            logger.error("checkpoint step-%08d could not be written to %s: %s; it is written again at the next "
                         "save (last durable checkpoint: %s)", step, self.root, one_line(err),
                         self.last_durable or "none")

    def _write_in_order(self, snapshot: dict[str, Any], step: int) -> None:
        """Background save: first a snapshot whose save failed before, then this one."""
        if self._failed is not None:
            (failed, failed_step), self._failed, self._error = self._failed, None, None
            self._write_or_record(failed, failed_step)
        self._write_or_record(snapshot, step)

    def save(self, components: dict[str, ModelParts], state: TrainerState | dict, step: int,
             block: bool = True) -> str:
        """Write every component and the loop state as `step-<step>`, then point `latest` at it.

        Args:
            components: name -> (model, optimizer, scheduler); each is saved under its name.
            state: The loop position, a dataclass or a JSON-able dict.
            step: Names the checkpoint directory.
            block: Wait for the files; False writes (uploads) them on a background thread
                while training goes on. `wait` joins it; the next save waits for it first.

        Returns:
            The checkpoint directory's URI.
        """
        self._join()
        if self._is_sharded(components):
            return self._save_sharded(components, state, step, block)
        snapshot = self.snapshot(components, state, copy=not block)
        if self.is_main_process:
            if block:
                self._write_blocking(snapshot, step)
            else:
                self._pending = threading.Thread(target=self._write_in_order, args=(snapshot, step), daemon=True)
                self._pending.start()
        if block:
            barrier()
        return join_uri(self.root, f"step-{step:08d}")

    def _write_blocking(self, snapshot: dict[str, Any], step: int) -> None:
        """Write a failed earlier snapshot, then this one; CheckpointError naming the last durable one."""
        try:
            if self._failed is not None:
                (failed, failed_step), self._failed, self._error = self._failed, None, None
                self.write(failed, failed_step)
            self.write(snapshot, step)
        except (StorageError, OSError) as err:
            raise CheckpointError(f"checkpoint step-{step:08d} could not be saved to {self.root}: {one_line(err)}; "
                                  f"last durable checkpoint: {self.last_durable or 'none'}") from err

    def _join(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def wait(self) -> None:
        """Block until a background save has finished; CheckpointError if it failed (raised once; its
        snapshot is still written again at the next save)."""
        self._join()
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"a background checkpoint could not be written to {self.root}: {one_line(error)}; "
                                  f"last durable checkpoint: {self.last_durable or 'none'}")

    def load(self, directory: str, components: dict[str, ModelParts]) -> dict[str, Any]:
        """Restore every component and this rank's RNG; return the saved loop state as a dict."""
        if self.holds_shards(directory, components):
            return self._load_sharded(directory, components)
        with tempfile.TemporaryDirectory(prefix="alignflow-resume-") as scratch:
            local = Path(directory) if not is_remote(directory) else Path(scratch)
            if is_remote(directory):
                download_prefix(directory, local)
            state = self._load_local(local, components)
        # The checkpoint's own URI, not the scratch copy an s3:// one was read from.
        logger.info("resumed from %s (%s)", directory, ", ".join(f"{k} {v}" for k, v in state.items()))
        return state

    def _load_local(self, directory: Path, components: dict[str, ModelParts]) -> dict[str, Any]:
        state = load_json((directory / STATE_FILE).read_bytes(), str(directory / STATE_FILE), CheckpointError)
        for name, (model, optimizer, scheduler) in components.items():
            booster = self.boosters.get(name, self.booster)
            if not (directory / f"{name}.pt").is_file():
                raise CheckpointError(f"{directory} has no {name}.pt: it was not written by this stage")
            # The booster reads these with torch.load(weights_only=True): no objects, only data.
            for load, target, file_name in ((booster.load_model, model, f"{name}.pt"),
                                            (booster.load_optimizer, optimizer, f"{name}.optimizer.pt"),
                                            (booster.load_lr_scheduler, scheduler, f"{name}.scheduler.pt")):
                with refusing_pickled_objects(directory / file_name, CheckpointError):
                    load(target, directory / file_name)
        self._restore_rank_rng(directory, directory)
        return state

    def _restore_rank_rng(self, local: Path, directory: str | Path) -> None:
        """This rank's RNG state from `local` (the checkpoint `directory` or its downloaded files)."""
        rank = self.booster.plugin.rank
        rng_file, pickled_rng_file = local / rng_state_file(rank), local / f"rng-rank{rank}.pt"
        if rng_file.is_file():
            self._restore_rng(rng_file)
        elif pickled_rng_file.is_file():
            raise CheckpointError(f"{pickled_rng_file}: RNG state as a pickle (an alignflow release before "
                                  "safetensors RNG files, or planted); not loaded, since unpickling runs code. "
                                  "Delete the file to resume without restoring the RNG state")
        else:
            logger.warning("%s has no RNG state for rank %d (world size changed); RNG not restored", directory, rank)

    @staticmethod
    def _restore_rng(path: Path) -> None:
        state = decode_rng_state(path.read_bytes(), str(path))
        try:
            restore_rng_state(state)
        except (ValueError, TypeError, RuntimeError) as err:
            raise CheckpointError(f"{path}: not a valid RNG state ({type(err).__name__}: {err})") from err

    def _step_names(self) -> list[str]:
        """Names of the `step-*` directories, oldest first."""
        prefix = self.root + "/"
        names = {uri[len(prefix):].split("/", 1)[0] for uri in self.storage.list(self.root)}
        return sorted(n for n in names if n.startswith("step-"))

    def _remove(self, directory: str) -> None:
        if is_remote(directory):
            for uri in self.storage.list(directory):
                self.storage.delete(uri)
        else:
            self.storage.delete(directory)

    def _apply_retention(self, latest: str) -> None:
        if self.keep_last <= 0:
            return
        names = self._step_names()
        complete = [n for n in names if self.storage.exists(join_uri(self.root, n, STATE_FILE))]
        keep = set(complete[-self.keep_last:]) | {latest}
        for name in names:
            if name not in keep and name < latest:
                self._remove(join_uri(self.root, name))
