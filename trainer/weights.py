"""Weight sync by checkpoint: the trainer publishes numbered policy versions, explorers poll them.

`weights_dir/version-00000007.pt` holds a full state dict; `weights_dir/LATEST` names the newest
version. Both are written to a temporary name and renamed, so a reader sees a version only once it
is complete.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from trainer.buffer import BufferTimeout

LATEST = "LATEST"


def publish_weights(directory: str | Path, state_dict: dict[str, torch.Tensor], version: int) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"version-{version:08d}.pt"
    temporary = directory / f".version-{version:08d}.tmp"
    torch.save(state_dict, temporary)
    os.replace(temporary, target)
    pointer = directory / f".{LATEST}.tmp"
    pointer.write_text(json.dumps({"version": version, "file": target.name}))
    os.replace(pointer, directory / LATEST)
    for old in directory.glob("version-*.pt"):  # readers load the newest; keep the last two
        if old.name < f"version-{version - 1:08d}.pt":
            old.unlink(missing_ok=True)
    return target


def latest_version(directory: str | Path) -> int:
    """Newest published version, or -1 when none is published yet."""
    pointer = Path(directory) / LATEST
    return json.loads(pointer.read_text())["version"] if pointer.is_file() else -1


def wait_for_version(directory: str | Path, minimum: int, timeout: float, poll_interval: float = 0.05) -> int:
    """Block until a version >= `minimum` is published; BufferTimeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (version := latest_version(directory)) < minimum:
        if time.monotonic() > deadline:
            raise BufferTimeout(f"{directory}: weight version {minimum} not published after {timeout:g} s "
                                f"(newest is {version}); is the trainer running?")
        time.sleep(poll_interval)
    return version


def load_version(directory: str | Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The newest published version and its state dict."""
    directory = Path(directory)
    entry = json.loads((directory / LATEST).read_text())
    return entry["version"], torch.load(directory / entry["file"], map_location="cpu", weights_only=True)
