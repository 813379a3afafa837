"""The FSDP2 half of `CheckpointManager`: checkpoints whose model and optimizer state are DCP shards.

Layout of such a `step-N/`: per component NAME a DCP directory `NAME.dcp/` (`__<rank>_0.distcp`
written and uploaded by each rank, `.metadata` by rank 0), and, as in a full checkpoint,
`NAME.scheduler.pt`, `rng-rank<R>.safetensors`, the attachments, `manifest.json` (with
`"format": "dcp"` and the size of every rank's files) and `trainer_state.json` last. No rank
gathers the model or the optimizer state; rank 0 writes only the small shared files, once every
rank's shards are up, so the marker still comes last and a reader never sees a partial checkpoint.

A sharded checkpoint loads under any plugin and world size (DCP reshards); `trainer.lifecycle.resume`
decides when a changed world size still resumes the run exactly. What it leaves out: background
saves (a sharded save is a collective, so it always runs in the foreground).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from trainer.checkpointing.common import STATE_FILE, ModelParts, gather_objects, one_line
from trainer.checkpointing.rng_state import capture_rng_state, encode_rng_state, rng_state_file
from trainer.checkpointing.serialization import load_json, refusing_pickled_objects
from trainer.errors import CheckpointError, StorageError
from trainer.jsonio import dumps
from trainer.parallel.booster import FSDP2Plugin
from trainer.storage import join_uri
from trainer.storage.transfer import upload_dir

logger = logging.getLogger(__name__)

# `trainer.checkpointing.sharded` is imported in the methods that use it: it imports
# torch.distributed.checkpoint, hence DTensor and sympy (~50 MB of RSS), which a run that never
# writes or reads shards would otherwise hold through its training peak.


class ShardedCheckpoints:
    """Mixed into `CheckpointManager`, whose attributes and `_write_extras`, `_publish`, `_remove`
    and `_restore_rank_rng` it uses."""

    def holds_shards(self, directory: str, components: dict[str, ModelParts]) -> bool:
        """Whether the checkpoint `directory` stores its components as DCP shards."""
        from trainer.checkpointing.sharded import METADATA_FILE as SHARD_METADATA
        from trainer.checkpointing.sharded import SUFFIX as SHARD_SUFFIX

        return any(self.storage.exists(join_uri(directory, f"{name}{SHARD_SUFFIX}", SHARD_METADATA))
                   for name in components)

    def _is_sharded(self, components: dict[str, ModelParts]) -> bool:
        return all(isinstance(self.boosters.get(name, self.booster).plugin, FSDP2Plugin) for name in components)

    def _save_sharded(self, components: dict[str, ModelParts], state: Any, step: int,
                      block: bool) -> str:
        """Every rank writes its shards (DCP) and uploads its own files; after all are up, rank 0 writes
        the rest (DCP's `.metadata`, schedulers, RNG states, manifest), the marker last, and `latest`.

        Always in the foreground: DCP's save is a collective, and so is knowing that every rank's
        upload finished. A failure is a CheckpointError on every rank, or (`block` False) one logged
        line, and the next save writes a new checkpoint.
        """
        from trainer.checkpointing.sharded import SUFFIX as SHARD_SUFFIX
        from trainer.checkpointing.sharded import write_shards

        name = f"step-{step:08d}"
        directory = join_uri(self.root, name)
        # Every failure is agreed on by all ranks before the next collective, so none is left waiting.
        error = self._on_main(lambda: self._remove(directory))  # left by a crash before its `latest`
        rng_states = gather_objects(capture_rng_state())
        if error is None:
            with tempfile.TemporaryDirectory(prefix="alignflow-checkpoint-") as staging_root:
                staging, sizes = Path(staging_root) / name, {}
                try:
                    for component, (model, optimizer, _) in components.items():
                        write_shards(model, optimizer, staging / f"{component}{SHARD_SUFFIX}")
                    sizes = self._upload_own_shards(staging, directory)
                except (CheckpointError, StorageError, OSError) as err:
                    error = one_line(err)
                reports = gather_objects((sizes, error))  # also where every rank's shards are known to be up
                error = next((error for _, error in reports if error), None)
                if error is None:
                    uploaded = {file_name: size for rank_sizes, _ in reports for file_name, size in rank_sizes.items()}
                    error = self._on_main(lambda: self._commit_sharded(staging, components, state, rng_states,
                                                                       uploaded))
        if error is None:
            self.last_durable = directory
            return directory
        message = (f"checkpoint {name} could not be saved to {self.root}: {error}; last durable checkpoint: "
                   f"{self.last_durable or 'none'}")
        if block:
            raise CheckpointError(message)
        if self.is_main_process:
            logger.error("%s; the next save writes a new one", message)
        return directory

    def _on_main(self, function: Any) -> str | None:
        """Run `function` on rank 0; its storage error (one line) or None, on every rank (a collective)."""
        error = None
        if self.is_main_process:
            try:
                function()
            except (StorageError, OSError) as err:
                error = one_line(err)
        return gather_objects(error)[0]

    def _upload_own_shards(self, staging: Path, directory: str) -> dict[str, int]:
        """Upload this rank's `.distcp` files; their sizes, by name in the checkpoint. Each is deleted
        once up, so rank 0's pass over its staging directory does not upload it again."""
        from trainer.checkpointing.sharded import SUFFIX as SHARD_SUFFIX

        sizes = {}
        for path in sorted(staging.glob(f"*{SHARD_SUFFIX}/*.distcp")):
            relative = path.relative_to(staging).as_posix()
            self.storage.upload_file(path, join_uri(directory, relative))
            sizes[relative] = path.stat().st_size
            path.unlink()
        return sizes

    def _commit_sharded(self, staging: Path, components: dict[str, ModelParts], state: Any,
                        rng_states: list[dict[str, Any]], uploaded: dict[str, int]) -> None:
        """Rank 0, after every rank's shards are up: the shared files, the manifest, the marker, `latest`."""
        from trainer.checkpointing.sharded import FORMAT as SHARDED_FORMAT

        for component, (_, _, scheduler) in components.items():
            torch.save(scheduler.state_dict(), staging / f"{component}.scheduler.pt")
        for rank, rng_state in enumerate(rng_states):
            (staging / rng_state_file(rank)).write_bytes(encode_rng_state(rng_state))
        (staging / STATE_FILE).write_text(dumps(state if isinstance(state, dict) else asdict(state)))
        self._write_extras(staging, self.attachments() if self.attachments is not None else {}, uploaded,
                           format=SHARDED_FORMAT)
        directory = join_uri(self.root, staging.name)
        upload_dir(staging, directory, skip=(STATE_FILE,))  # DCP's `.metadata` goes up after every shard
        self.storage.upload_file(staging / STATE_FILE, join_uri(directory, STATE_FILE))
        self._publish(staging.name)

    def _load_sharded(self, directory: str, components: dict[str, ModelParts]) -> dict[str, Any]:
        """Each rank fetches the small files and only the shard files its slices overlap (`StorageShardReader`)."""
        from trainer.checkpointing.sharded import METADATA_FILE as SHARD_METADATA
        from trainer.checkpointing.sharded import SUFFIX as SHARD_SUFFIX
        from trainer.checkpointing.sharded import StorageShardReader, read_shards

        with tempfile.TemporaryDirectory(prefix="alignflow-resume-") as scratch:
            local = Path(scratch)
            state = self._fetch_small_files_agreed(directory, components, local)
            for name, (model, optimizer, scheduler) in components.items():
                shards = join_uri(directory, f"{name}{SHARD_SUFFIX}")
                if not self.storage.exists(join_uri(shards, SHARD_METADATA)):
                    raise CheckpointError(f"{directory} has no {name}{SHARD_SUFFIX}: it was not written by this stage")
                reader = StorageShardReader(shards, local / f"{name}{SHARD_SUFFIX}")
                read_shards(model, optimizer, reader)
                self.shard_files_read[name] = sorted(reader.files_read)
                with refusing_pickled_objects(join_uri(directory, f"{name}.scheduler.pt"), CheckpointError):
                    self.boosters.get(name, self.booster).load_lr_scheduler(scheduler, local / f"{name}.scheduler.pt")
            self._restore_rank_rng(local, directory)
        logger.info("resumed from %s (%s)", directory, ", ".join(f"{k} {v}" for k, v in state.items()))
        return state

    def _fetch_small_files_agreed(self, directory: str, components: dict[str, ModelParts], local: Path) -> dict:
        """This rank's small files of `directory` into `local`, and its training state; every rank or none.

        DCP's load is a collective: a rank that failed here (a download that ran out of retries, its own
        RNG file unreadable) and left would keep the others waiting in it until the process group times
        out. So the ranks agree first, and all raise the same kind of error, which the caller treats
        as a damaged checkpoint (it tries the one before).
        """
        from trainer.runtime import any_rank_failed

        rank = self.booster.plugin.rank
        state, error = None, None
        try:
            for file_name in (STATE_FILE, rng_state_file(rank), f"rng-rank{rank}.pt",
                              *(f"{name}.scheduler.pt" for name in components)):
                if self.storage.exists(join_uri(directory, file_name)):
                    self.storage.download_file(join_uri(directory, file_name), local / file_name)
            state = load_json((local / STATE_FILE).read_bytes(), join_uri(directory, STATE_FILE), CheckpointError)
        except (CheckpointError, StorageError, OSError) as err:
            error = err
        another_failed = any_rank_failed(error is not None, self.booster.plugin.device)
        if error is not None:
            raise CheckpointError(f"{directory}: rank {rank} could not fetch its files: {one_line(error)}") from error
        if another_failed:
            raise CheckpointError(f"{directory}: another rank could not fetch its files")
        return state
