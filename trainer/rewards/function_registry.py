"""Reward functions by name: the platform's allow-list (`trainer.allow_list.REWARDS`) and how a function is called.

`reward.function` (and a `function` source's `name`) resolves only through the allow-list in
`trainer.allow_list`: built-ins `tiny_addition` and `tiny_calculator`, `alignflow.rewards` entry
points, `ALIGNFLOW_REWARD_FUNCTIONS` and `ALIGNFLOW_ALLOWED_REWARD_MODULES`.

A function is called as `f(prompt, completion, answer) -> float`, or, when it has the attribute
`alignflow_batched = True` (see `batched_reward`), in TRL's batched form
`f(prompts, completions, answer=answers) -> list[float]`. Running and checking the calls is
`trainer.rewards.functions.FunctionScorer`'s job; this module only decides and imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainer.allow_list import REWARDS, AllowList, read_allow_list

RewardAllowList = AllowList  # of kind REWARDS


def batched_reward(function: Callable) -> Callable:
    """Mark `function` as TRL-style batched: `f(prompts, completions, **columns) -> list[float]`."""
    function.alignflow_batched = True
    return function


@dataclass(frozen=True, slots=True)
class RewardFunction:
    """A resolved reward function: the name it was asked for, where it lives, and how to call it."""

    name: str
    target: str
    """`module:function` it was imported from."""
    function: Callable[..., Any]
    is_batched: bool


def read_reward_allow_list(environ: Mapping[str, str] | None = None) -> RewardAllowList:
    """The reward functions a run may use: built-ins, installed entry points and the platform's environment."""
    return read_allow_list(REWARDS, environ)


def resolve_reward_function(spec: str, allow_list: RewardAllowList | None = None,
                            key: str = "reward.function") -> RewardFunction:
    """Check `spec` against the allow-list, then import it.

    Args:
        spec: A registered name (`tiny_addition`) or an allowed `module:function`.
        allow_list: Default: `read_reward_allow_list()` (built-ins, entry points, environment).
        key: The config key `spec` came from, named in errors (`reward.sources.0.name`).

    Raises:
        ConfigError: `spec` is not allowed, cannot be imported, or is not callable.
    """
    allow_list = read_reward_allow_list() if allow_list is None else allow_list
    target, function = allow_list.load(spec, key)
    return RewardFunction(spec, target, function, bool(getattr(function, "alignflow_batched", False)))
