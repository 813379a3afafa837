"""Each rank's random number generator states as a checkpoint file: safetensors plus JSON metadata.

The torch and CUDA states are tensors; python's and numpy's are tuples, stored as JSON in the
safetensors metadata, so reading an RNG file back unpickles nothing (see `serialization`).
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch

from trainer.checkpointing.serialization import dump_tensors, load_tensors
from trainer.errors import CheckpointError


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


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
