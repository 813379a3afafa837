"""Atomic, resumable checkpoints under `<output_dir>/checkpoints/`.

The checkpoint root is a local path or an `s3://` URI (through `trainer.storage`).
Layout of one checkpoint, `step-00000042/`: for each trained component NAME (`model` for the
supervised stages, `actor` and `critic` for PPO) `NAME.pt`, `NAME.optimizer.pt` and
`NAME.scheduler.pt` (full state dicts, see `Booster`); `rng-rank<R>.safetensors` (each rank's
torch/CUDA RNG states as tensors, its python/numpy states as JSON metadata); and
`trainer_state.json` (the loop position), written last as the checkpoint's completion marker.
Only then does rank 0 replace the `latest` pointer (atomically),
so a reader never picks up a half-written checkpoint; a crash or a failed upload mid-save leaves
the previous `latest`. Older checkpoints are deleted only after a newer one is complete.

Checkpoints sit where others can write, so resuming unpickles nothing (see `trainer.serialization`):
the state dicts are read with `torch.load(weights_only=True)`, the rest as safetensors and JSON, and
a file that is not what its name says is a `CheckpointError` naming it.
"""

from __future__ import annotations

import json
import logging
import random
import re
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer.booster import Booster
from trainer.errors import CheckpointError
from trainer.runtime import barrier
from trainer.serialization import dump_tensors, load_json, load_tensors, refusing_pickled_objects
from trainer.storage import get_storage, join_uri
from trainer.storage.base import is_remote
from trainer.storage.transfer import download_prefix, upload_dir

logger = logging.getLogger(__name__)

LATEST = "latest"
STATE_FILE = "trainer_state.json"
STEP_NAME = re.compile(r"step-\d{8,}")

# (model, optimizer, lr scheduler) of one trained network.
ModelParts = tuple[torch.nn.Module, torch.optim.Optimizer, Any]


@dataclass(slots=True)
class TrainerState:
    """Where the loop stands: the next epoch to run and how far into it the run got."""

    epoch: int = 0
    global_step: int = 0
    samples_in_epoch: int = 0
    """Samples of `epoch` already consumed, summed over all ranks."""
    world_size: int = 1


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just `[obj]` outside a process group)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def copy_tensors(obj: Any) -> Any:
    """A copy of nested dicts/lists/tuples in which every tensor is cloned."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: copy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_tensors(v) for v in obj)
    return obj


def rng_state_file(rank: int) -> str:
    return f"rng-rank{rank}.safetensors"


def encode_rng_state(state: dict[str, Any]) -> bytes:
    """A `capture_rng_state` dict as safetensors: torch/CUDA states as tensors, python/numpy as JSON."""
    tensors = {"torch": state["torch"], **{f"cuda.{i}": s for i, s in enumerate(state.get("cuda", []))}}
    version, internal, gauss_next = state["python"]
    generator, keys, position, has_gauss, cached_gaussian = state["numpy"]
    metadata = {"python": json.dumps([version, list(internal), gauss_next]),
                "numpy": json.dumps([generator, keys.tolist(), int(position), int(has_gauss), float(cached_gaussian)])}
    return dump_tensors(tensors, metadata)


def decode_rng_state(payload: bytes, name: str) -> dict[str, Any]:
    """The inverse of `encode_rng_state`; CheckpointError naming `name` when the file is not one."""
    tensors, metadata = load_tensors(payload, name, CheckpointError)
    try:
        version, internal, gauss_next = json.loads(metadata["python"])
        generator, keys, position, has_gauss, cached_gaussian = json.loads(metadata["numpy"])
        state = {"python": (version, tuple(internal), gauss_next),
                 "numpy": (generator, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian),
                 "torch": tensors["torch"]}
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{name}: not an RNG state file ({type(err).__name__}: {err})") from err
    cuda = sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k.split(".", 1)[1]))
    if cuda:
        state["cuda"] = [tensors[k] for k in cuda]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
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

    def latest(self) -> str | None:
        """The newest complete checkpoint, or None. Directories without a `latest` pointer are ignored."""
        pointer = join_uri(self.root, LATEST)
        if not self.storage.exists(pointer):
            return None
        name = self.storage.read_bytes(pointer).decode(errors="replace").strip()
        if not STEP_NAME.fullmatch(name):  # a pointer elsewhere (`../other-run`) is not followed
            raise CheckpointError(f"{pointer} holds {name[:80]!r}, expected a checkpoint name like step-00000042")
        directory = join_uri(self.root, name)
        if not self.storage.exists(join_uri(directory, STATE_FILE)):
            raise CheckpointError(f"{pointer} names {directory}, which has no {STATE_FILE}")
        return directory

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
        return {"files": files, "state": state if isinstance(state, dict) else asdict(state)}

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
            (staging / STATE_FILE).write_text(json.dumps(snapshot["state"]))
            self._remove(directory)  # left by a crash before its `latest` was written
            upload_dir(staging, directory, skip=(STATE_FILE,))
            self.storage.upload_file(staging / STATE_FILE, join_uri(directory, STATE_FILE))
        self.storage.write_bytes(join_uri(self.root, LATEST), name.encode())
        self._apply_retention(name)
        logger.info("saved checkpoint %s", directory)
        return directory

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
        self.wait()
        snapshot = self.snapshot(components, state, copy=not block)
        if self.is_main_process:
            if block:
                self.write(snapshot, step)
            else:
                self._pending = threading.Thread(target=self.write, args=(snapshot, step), daemon=True)
                self._pending.start()
        if block:
            barrier()
        return join_uri(self.root, f"step-{step:08d}")

    def wait(self) -> None:
        """Block until a background save has finished."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def load(self, directory: str, components: dict[str, ModelParts]) -> dict[str, Any]:
        """Restore every component and this rank's RNG; return the saved loop state as a dict."""
        with tempfile.TemporaryDirectory(prefix="alignflow-resume-") as scratch:
            local = Path(directory) if not is_remote(directory) else Path(scratch)
            if is_remote(directory):
                download_prefix(directory, local)
            return self._load_local(local, components)

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
        rank = self.booster.plugin.rank
        rng_file, pickled_rng_file = directory / rng_state_file(rank), directory / f"rng-rank{rank}.pt"
        if rng_file.is_file():
            self._restore_rng(rng_file)
        elif pickled_rng_file.is_file():
            raise CheckpointError(f"{pickled_rng_file}: RNG state as a pickle (an alignflow release before "
                                  "safetensors RNG files, or planted); not loaded, since unpickling runs code. "
                                  "Delete the file to resume without restoring the RNG state")
        else:
            logger.warning("%s has no RNG state for rank %d (world size changed); RNG not restored",
                           directory, self.booster.plugin.rank)
        logger.info("resumed from %s (%s)", directory, ", ".join(f"{k} {v}" for k, v in state.items()))
        return state

    @staticmethod
    def _restore_rng(path: Path) -> None:
        state = decode_rng_state(path.read_bytes(), str(path))
        try:
            restore_rng_state(state)
        except (ValueError, TypeError, RuntimeError) as err:
            raise CheckpointError(f"{path}: not a valid RNG state ({type(err).__name__}: {err})") from err

    def _step_names(self) -> list[str]:
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
