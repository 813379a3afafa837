"""Sharded model and optimizer state with `torch.distributed.checkpoint` (DCP): no rank holds it all.

Under FSDP2 each rank holds a slice of every parameter and of its optimizer state. A full state
dict would gather all of it on one rank (a 7B model with AdamW: about 84 GB); instead each trained
component NAME of a checkpoint is a DCP directory `NAME.dcp/` holding one `__<rank>_0.distcp` per
rank (that rank's slices of the model's parameters and the optimizer's state) and `.metadata`
(which chunk of which tensor lies at which offset of which file). `CheckpointManager` stages these
files, uploads each rank's own, and commits the checkpoint; this module turns state into files and
back and knows nothing of storage layout beyond one DCP directory.

Reading reshards: DCP plans each rank's reads from `.metadata` against the model as it is now (any
world size, FSDP2 or a plain module), and `StorageShardReader` fetches only the `.distcp` files that
plan touches. At the same world size a rank reads its own file, plus the file that holds a
deduplicated replicated value (DCP stores one copy of, e.g., the optimizer's step count); at another
world size, the files its new slices overlap.

Nothing is unpickled: DCP writes `.metadata` as a pickle, which is read here by an unpickler that
admits only DCP's metadata classes, and non-tensor values (the optimizer's hyper-parameters) are
read with `torch.load(weights_only=True)` instead of DCP's default `weights_only=False`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.checkpointing.serialization import NOT_A_PICKLE, refusing_pickled_objects
from trainer.errors import CheckpointError
from trainer.storage import get_storage, is_remote, join_uri
from trainer.storage.local import local_path

SUFFIX = ".dcp"
METADATA_FILE = ".metadata"
FORMAT = "dcp"
"""The manifest's `format` for a checkpoint whose components are DCP directories."""

# (module, name) pairs a DCP `.metadata` pickle may name; anything else is refused.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
     ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                      torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP metadata file")


def read_metadata(path: Path) -> Metadata:
    """A DCP `.metadata` file, admitting only DCP's metadata classes; CheckpointError naming it otherwise."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a DCP metadata file ({err}); refusing to read it ({NOT_A_PICKLE})") from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: not a DCP metadata file (holds a {type(metadata).__name__})")
    return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor values with `torch.load(weights_only=True)` (plain data only)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        with refusing_pickled_objects(fqn, CheckpointError):
            loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:  # as `DefaultLoadPlanner.load_bytes` does, minus its weights_only=False
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class StorageShardReader(FileSystemReader):
    """Reads one DCP directory from a local path or an `s3://` URI, fetching only the files DCP asks for.

    Args:
        uri: The DCP directory (`.../step-N/NAME.dcp`).
        local_dir: Where remote files are downloaded (ignored for a local `uri`).
    """

    def __init__(self, uri: str, local_dir: Path) -> None:
        self.uri = uri.rstrip("/")
        self.is_remote = is_remote(self.uri)
        super().__init__(local_dir if self.is_remote else local_path(self.uri))  # `file://` URIs too
        self.local_dir = Path(self.path)
        self.files_read: set[str] = set()
        """The files this rank read (its load plan's), relative to the directory."""

    def _fetch(self, relative: str) -> Path:
        target = self.local_dir / relative
        if self.is_remote and not target.is_file():
            get_storage(self.uri).download_file(join_uri(self.uri, relative), target)
        self.files_read.add(relative)
        return target

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then never falls back to per-rank metadata
        metadata = read_metadata(self._fetch(METADATA_FILE))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        for relative in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
            self._fetch(relative)
        return super().read_data(plan, planner)


def _first_failure(err: CheckpointException) -> str:
    """DCP raises one exception (a BaseException) carrying every rank's; the first one's message."""
    failures = getattr(err, "failures", {}) or {}
    for rank in sorted(failures):
        failure = failures[rank]
        cause = failure[0] if isinstance(failure, tuple) else failure
        return f"rank {rank}: {type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def write_shards(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Write this rank's slices of `model` and `optimizer` into the DCP directory `directory` (a collective).

    Every rank passes its own local `directory`; the coordinator (rank 0) also writes `.metadata` there.
    Raises CheckpointError (on every rank) when any rank failed.
    """
    # Default options: sharded (DTensor) values, nothing gathered and nothing copied to CPU.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state},
                 storage_writer=FileSystemWriter(directory, sync_files=False))
    except CheckpointException as err:
        raise CheckpointError(f"writing {directory} failed: {_first_failure(err)}") from err


def read_shards(model: nn.Module, optimizer: torch.optim.Optimizer, reader: StorageShardReader) -> None:
    """Load `model` and `optimizer` from the DCP directory behind `reader`, resharded to how they are now.

    A collective when a process group exists. Raises CheckpointError (on every rank) when any rank failed.
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the target: this rank's slices
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, storage_reader=reader, planner=WeightsOnlyLoadPlanner())
    except CheckpointException as err:
        raise CheckpointError(f"{reader.uri}: {_first_failure(err)}") from err
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
