"""Finding the trained scalar head of a reward model or critic saved as a Hugging Face directory.

Two layouts carry one: alignflow's own export (`value_head.safetensors` beside the backbone, see
`trainer.modeling.models.export_model`) and Hugging Face's `*ForSequenceClassification` with one label
(`LlamaForSequenceClassification`, `Qwen2ForSequenceClassification`, ...), whose head is a bias-free
linear layer named `score` (`classifier` in some architectures) stored with the backbone's weights.
`AutoModel` loads only the backbone and drops that head, so it is read here, from the weight files
directly: the head is what the directory's `*ForSequenceClassification` class holds outside its base
model, and its checkpoint keys are matched as `from_pretrained` matches them
(`trainer.modeling.checkpoint_keys`). A sequence classifier whose head cannot be found, or has more
than one label, is an error: scoring with a randomly initialised head would train a policy against noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.errors import ConfigError
from trainer.modeling.checkpoint_keys import map_checkpoint_keys

VALUE_HEAD_FILE = "value_head.safetensors"


def architectures(directory: Path) -> list[str]:
    """The `architectures` named by the model's `config.json`."""
    try:
        return list(json.loads((directory / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError) as err:
        raise ConfigError(f"{directory / 'config.json'}: not a readable model config ({err})") from err


def is_sequence_classifier(directory: Path) -> bool:
    return any(name.endswith("ForSequenceClassification") for name in architectures(directory))


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it, for every tensor of the directory's weights."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            return {key: directory / file for key, file in json.loads(index.read_text()).get("weight_map", {}).items()}
    single = directory / "model.safetensors"
    if single.is_file():
        with safe_open(str(single), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), single)
    single = directory / "pytorch_model.bin"
    if single.is_file():
        return dict.fromkeys(torch.load(single, map_location="cpu", weights_only=True, mmap=True), single)
    return {}


def _read(path: Path, key: str) -> torch.Tensor:
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(key)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)[key]  # maps, reads one tensor


def _classifier_head(directory: Path, key: str, files: dict[str, Path]) -> tuple[str, dict[str, str | None]]:
    """The classifier's head module name and its parameters' checkpoint keys (None where `files`, the directory's
    tensor name -> file, has none).

    The head is what the `*ForSequenceClassification` class holds outside its base model (`score` in the
    causal LM families), and its keys are matched as `from_pretrained` matches them.
    """
    from transformers import AutoModelForSequenceClassification

    from trainer.modeling.sharded_load import build_on_meta

    try:
        classifier = build_on_meta(AutoModelForSequenceClassification, directory)
    except (ValueError, KeyError) as err:
        raise ConfigError(f"{key}: cannot build the sequence classifier of {directory} "
                          f"({'/'.join(architectures(directory))}): {err}") from err
    sources = map_checkpoint_keys(classifier, files).sources
    inside = f"{classifier.base_model_prefix}."
    head = {name: sources.get(name) for name, _ in classifier.named_parameters() if not name.startswith(inside)}
    modules = {name.rsplit(".", 1)[0] for name in head}
    if len(modules) != 1 or not set(head) <= {f"{next(iter(modules))}.weight", f"{next(iter(modules))}.bias"}:
        raise ConfigError(f"{key}: {directory}'s classification head is not one linear layer "
                          f"({', '.join(sorted(head)) or 'no parameters'}); alignflow reads a single scalar head")
    return modules.pop(), head


def sequence_classifier_head(directory: Path, hidden_size: int, key: str) -> dict[str, torch.Tensor]:
    """The `weight` (1, hidden) and `bias` (1,) of a `*ForSequenceClassification` directory's head.

    Raises:
        ConfigError: The head is not one linear layer, its weight is not in the files or not (num_labels,
            hidden), or num_labels is not 1.
    """
    files = _weight_files(directory)
    name, head = _classifier_head(directory, key, files)
    weight_key = head.get(f"{name}.weight")
    weight = _read(files[weight_key], weight_key) if weight_key in files else None
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden_size:
        raise ConfigError(f"{key}: {directory} is a {'/'.join(architectures(directory))} but its weights have no "
                          f"classification head ({name}.weight of shape (1, {hidden_size})); it would be scored "
                          "by a random head")
    if weight.shape[0] != 1:
        raise ConfigError(f"{key}: {directory} is a sequence classifier with {weight.shape[0]} labels "
                          f"({weight_key} is {tuple(weight.shape)}); a reward model has exactly 1 output")
    bias_key = head.get(f"{name}.bias")
    bias = _read(files[bias_key], bias_key) if bias_key in files else torch.zeros(1)
    return {"weight": weight.float(), "bias": bias.float()}


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
