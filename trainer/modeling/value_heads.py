"""Finding the trained scalar head of a reward model or critic saved as a Hugging Face directory.

Two layouts carry one: alignflow's own export (`value_head.safetensors` beside the backbone, see
`trainer.modeling.models.export_model`) and Hugging Face's `*ForSequenceClassification` with one label
(`LlamaForSequenceClassification`, `Qwen2ForSequenceClassification`, ...), whose head is a bias-free
linear layer named `score` (`classifier` in some architectures) stored with the backbone's weights.
`AutoModel` loads only the backbone and drops that head, so it is read here, from the weight files
directly. A sequence classifier whose head cannot be found, or has more than one label, is an error:
scoring with a randomly initialised head would train a policy against noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.errors import ConfigError

VALUE_HEAD_FILE = "value_head.safetensors"
HEAD_NAMES = ("score", "classifier", "v_head", "value_head")


def architectures(directory: Path) -> list[str]:
    """The `architectures` named by the model's `config.json`."""
    try:
        return list(json.loads((directory / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError) as err:
        raise ConfigError(f"{directory / 'config.json'}: not a readable model config ({err})") from err


def is_sequence_classifier(directory: Path) -> bool:
    return any(name.endswith("ForSequenceClassification") for name in architectures(directory))


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it, for the head candidates only."""
    wanted = {f"{name}.{part}" for name in HEAD_NAMES for part in ("weight", "bias")}
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            return {key: directory / file for key, file in weight_map.items() if key in wanted}
    found: dict[str, Path] = {}
    single = directory / "model.safetensors"
    if single.is_file():
        with safe_open(str(single), framework="pt") as handle:
            found.update({key: single for key in handle.keys() if key in wanted})
    elif (directory / "pytorch_model.bin").is_file():
        found.update({key: directory / "pytorch_model.bin" for key in wanted})
    return found


def _read(path: Path, key: str) -> torch.Tensor | None:
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(key) if key in handle.keys() else None
    return torch.load(path, map_location="cpu", weights_only=True).get(key)


def sequence_classifier_head(directory: Path, hidden_size: int, key: str) -> dict[str, torch.Tensor]:
    """The `weight` (1, hidden) and `bias` (1,) of a `*ForSequenceClassification` directory's head.

    Raises:
        ConfigError: No head of shape (num_labels, hidden) under a known name, or num_labels is not 1.
    """
    files = _weight_files(directory)
    for name in HEAD_NAMES:
        if f"{name}.weight" not in files:
            continue
        weight = _read(files[f"{name}.weight"], f"{name}.weight")
        if weight is None or weight.dim() != 2 or weight.shape[1] != hidden_size:
            continue
        if weight.shape[0] != 1:
            raise ConfigError(f"{key}: {directory} is a sequence classifier with {weight.shape[0]} labels "
                              f"({name}.weight is {tuple(weight.shape)}); a reward model has exactly 1 output")
        bias = _read(files[f"{name}.bias"], f"{name}.bias") if f"{name}.bias" in files else None
        return {"weight": weight.float(), "bias": bias.float() if bias is not None else torch.zeros(1)}
    raise ConfigError(f"{key}: {directory} is a {'/'.join(architectures(directory))} but its weights have no "
                      f"classification head ({' or '.join(f'{n}.weight' for n in HEAD_NAMES)} of shape "
                      f"(1, {hidden_size})); it would be scored by a random head")


def find_value_head(directory: Path, hidden_size: int, key: str, required: bool) -> dict[str, torch.Tensor] | None:
    """The trained head saved in `directory` (`weight`, `bias`), or None when it has none and none is required.

    Args:
        directory: A local Hugging Face model directory.
        hidden_size: The backbone's hidden size (the head's input width).
        key: The config key the directory came from, named in errors.
        required: Raise instead of returning None (a reward model must bring its trained head).

    Raises:
        ConfigError: A sequence classifier without a usable head, or no head where one is required.
    """
    if (directory / VALUE_HEAD_FILE).is_file():
        return {k.removeprefix("head."): v for k, v in load_file(directory / VALUE_HEAD_FILE).items()}
    if is_sequence_classifier(directory):
        return sequence_classifier_head(directory, hidden_size, key)
    if required:
        raise ConfigError(f"{key}: {directory} has no trained value head (no {VALUE_HEAD_FILE}, and it is a "
                          f"{'/'.join(architectures(directory)) or 'model'} rather than a *ForSequenceClassification); "
                          "train one with the rm stage or point at a reward model")
    return None
