"""Formats for files that are read back from shared storage: safetensors for tensors, JSON for the rest.

Checkpoints, experience batches and weight versions live where other people and processes can
write (an S3 prefix, a shared volume). A pickle from there would run whatever code its author put
in it, so nothing alignflow reads back is unpickled: tensors travel as safetensors (a JSON header
plus raw bytes) with string metadata, everything else as JSON. The one exception is state that is
a nested Python structure by nature (optimizer and scheduler state dicts, written by the booster),
which is read with `torch.load(weights_only=True)`: its unpickler accepts tensors and plain
containers only and never calls a constructor named by the file. A file that is not what it should
be is an error naming it, of the caller's domain (`CheckpointError`, `DataError`).

This module knows bytes and error classes, not storage or what the tensors mean.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from trainer.errors import AlignflowError

NOT_A_PICKLE = "alignflow never unpickles files it reads back"


def dump_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Tensors (and string metadata) as safetensors bytes.

    Tensors that share storage (tied weights, views) are copied, because safetensors stores each
    tensor's bytes once and refuses aliases.
    """
    seen: set[int] = set()
    plain = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(pointer)
        plain[name] = tensor.contiguous()
    return save_safetensors(plain, metadata=metadata)


def load_tensors(payload: bytes, name: str, error: type[AlignflowError]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata from safetensors bytes; `error` naming `name` when they are not that."""
    try:
        tensors = load_safetensors(payload)
        metadata = _read_metadata(payload)
    except (SafetensorError, ValueError, OSError) as err:
        raise error(f"{name}: not a safetensors file ({err}); refusing to read it ({NOT_A_PICKLE})") from err
    return tensors, metadata


def _read_metadata(payload: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors header (the loader above already checked the header)."""
    header_size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8:8 + header_size])
    return dict(header.get("__metadata__") or {})


def load_json(payload: bytes | str, name: str, error: type[AlignflowError], expected: type = dict) -> Any:
    """Parse JSON, checking the top-level type; `error` naming `name` otherwise."""
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as err:
        raise error(f"{name}: not valid JSON ({err})") from err
    if not isinstance(value, expected):
        raise error(f"{name}: expected a JSON {expected.__name__}, found {type(value).__name__}")
    return value


@contextlib.contextmanager
def refusing_pickled_objects(name: str | Path, error: type[AlignflowError]) -> Iterator[None]:
    """Around a `torch.load(weights_only=True)`: a file holding anything but tensors and plain data
    becomes `error` naming it (torch's own message suggests `weights_only=False`, which must not happen)."""
    try:
        yield
    except pickle.UnpicklingError as err:
        raise error(f"{name}: refusing to load it: it holds objects other than tensors and plain data "
                    f"({NOT_A_PICKLE})") from err
