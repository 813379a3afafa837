"""Reward sources: a trained reward model, or a Python function named by import path."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from trainer.config import OnlineStageConfig
from trainer.errors import ConfigError
from trainer.models import load_frozen, load_value_model

RewardFunction = Callable[[str, str, Any], float]


def load_reward_function(spec: str) -> RewardFunction:
    """Import `module:function`; the function is called as f(prompt, completion, answer) -> float."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"reward.function is {spec!r}, expected 'module:function'")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"reward.function: cannot import {spec!r}: {err}") from err
    if not callable(function):
        raise ConfigError(f"reward.function: {spec!r} is not callable")
    return function


class FunctionScorer:
    """Scores decoded responses with a reward function."""

    def __init__(self, function: RewardFunction) -> None:
        self.function = function

    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        scores = [float(self.function(p, c, a)) for p, c, a in zip(prompts, completions, answers)]
        return torch.tensor(scores, device=batch["input_ids"].device)


class RewardModelScorer:
    """Scores sequences with a reward model's value at the last response token."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        values = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"])  # (B, T)
        # Responses are right-padded after left-padded prompts, so "last non-pad" is the last action.
        return _last_action_values(values, batch["action_mask"])


def _last_action_values(values: Tensor, action_mask: Tensor) -> Tensor:
    """(B, T) values at each row's last response token -> (B,)."""
    positions = torch.arange(action_mask.shape[1], device=action_mask.device)
    last = (action_mask * positions).argmax(dim=1)
    return values.gather(1, last.unsqueeze(1)).squeeze(1).float()


def build_scorer(config: OnlineStageConfig, device: torch.device) -> Any:
    """The configured reward source: a function by name, or a frozen reward model on `device`."""
    if config.reward.function is not None:
        return FunctionScorer(load_reward_function(config.reward.function))
    reward_model = load_frozen(load_value_model, config.model, device, config.reward.model_path, key="reward.model_path")
    return RewardModelScorer(reward_model)
