"""Weight sync by checkpoint: the trainer publishes numbered policy versions, explorers poll them.

`weights_dir/version-00000007.safetensors` holds a full state dict (safetensors, never a pickle:
whoever can write the prefix must not be able to run code in an explorer); `weights_dir/LATEST`
names the newest version. The directory is a local path or an `s3://` prefix; each object is written whole (a rename
locally, one PUT on S3) and `LATEST` after the version it names, so a reader sees a version only
once it is complete.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from trainer.checkpointing.serialization import dump_tensors, load_tensors
from trainer.config import OnlineStageConfig
from trainer.errors import CheckpointError, WaitTimeout
from trainer.storage import get_storage, join_uri
from trainer.storage.pointer import read_pointer, write_pointer

LATEST = "LATEST"
VERSION_FILE = re.compile(r"version-(\d{8,})\.safetensors")


def publish_weights(directory: str | Path, state_dict: dict[str, torch.Tensor], version: int) -> str:
    directory = str(directory).rstrip("/")
    storage = get_storage(directory)
    name = f"version-{version:08d}.safetensors"
    storage.write_bytes(join_uri(directory, name), dump_tensors(state_dict))
    write_pointer(storage, directory, LATEST, name)
    for uri in storage.list(directory):  # readers load the newest; keep the last two
        old = uri.rsplit("/", 1)[-1]
        if VERSION_FILE.fullmatch(old) and old < f"version-{version - 1:08d}.safetensors":
            storage.delete(uri)
    return join_uri(directory, name)


def _read_latest(directory: str | Path) -> dict | None:
    """The newest version as {"version": N, "file": name}, None when none is published."""
    name = read_pointer(get_storage(directory), str(directory), LATEST, VERSION_FILE)
    if name is None:
        return None
    return {"version": int(VERSION_FILE.fullmatch(name).group(1)), "file": name}


def latest_version(directory: str | Path) -> int:
    """Newest published version, or -1 when none is published yet."""
    entry = _read_latest(directory)
    return entry["version"] if entry else -1


def wait_for_version(directory: str | Path, minimum: int, timeout: float, poll_interval: float = 0.05) -> int:
    """Block until a version >= `minimum` is published; WaitTimeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (version := latest_version(directory)) < minimum:
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{directory}: weight version {minimum} not published after {timeout:g} s "
                                f"(newest is {version}); is the trainer running?")
        time.sleep(poll_interval)
    return version


def load_version(directory: str | Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The newest published version and its state dict."""
    entry = _read_latest(directory)
    if entry is None:
        raise WaitTimeout(f"{directory}: no weight version published")
    uri = join_uri(directory, entry["file"])
    return entry["version"], load_tensors(get_storage(directory).read_bytes(uri), uri, CheckpointError)[0]


def weights_dir(config: OnlineStageConfig) -> str:
    """Where the explorer and trainer of a run meet: `asynchronous.weights_dir`, else `<output_dir>/weights`."""
    return config.asynchronous.weights_dir or join_uri(config.output_dir, "weights")
