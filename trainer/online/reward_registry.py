"""Which reward functions a run may call: built-ins, the platform's registrations, allowed modules.

`reward.function` comes from a config or a pipeline parameter, that is from whoever submits a run.
Importing whatever `module:function` it names would let them call any callable in the image with
arguments the data controls (`os:execl` with a prompt `/usr/bin/touch` replaced the trainer by
`touch`). So a name resolves only through this allow-list, which the platform team controls:

- built-ins: `tiny_calculator` (the tiny tool-use task's checker) and `tiny_addition` (the tiny task's checker; its import path `trainer.tiny.task:reward`
  is accepted as an alias, since existing pipelines and configs use it);
- entry points of installed packages in the group `alignflow.rewards`
  (`[project.entry-points."alignflow.rewards"] exact_match = "acme_rewards.math:exact_match"`),
  that is whatever the trainer image installs;
- `ALIGNFLOW_REWARD_FUNCTIONS`: comma-separated `name=module:function` (the chart's ConfigMap);
- `ALIGNFLOW_ALLOWED_REWARD_MODULES`: comma-separated module prefixes (`acme_rewards`,
  `team.rewards`) whose functions may be named directly as `module:function`. A prefix matches
  whole dotted parts: `acme` allows `acme` and `acme.x`, not `acme_evil`.

Later sources override earlier ones for the same name. A registered target may also be named by
its own `module:function`. Anything else is a `ConfigError` of one line listing the allowed names.

A function is called as `f(prompt, completion, answer) -> float`, or, when it has the attribute
`alignflow_batched = True` (see `batched_reward`), in TRL's batched form
`f(prompts, completions, answer=answers) -> list[float]`. Running and checking the calls is
`trainer.online.reward_sources.FunctionScorer`'s job; this module only decides and imports.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from trainer.errors import ConfigError

ENTRY_POINT_GROUP = "alignflow.rewards"
FUNCTIONS_ENV = "ALIGNFLOW_REWARD_FUNCTIONS"
MODULES_ENV = "ALIGNFLOW_ALLOWED_REWARD_MODULES"
BUILTIN_REWARDS: Mapping[str, str] = MappingProxyType({"tiny_addition": "trainer.tiny.task:reward",
                                                       "tiny_calculator": "trainer.tiny.agent_task:reward"})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\.?")


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


@dataclass(frozen=True, slots=True)
class RewardAllowList:
    """The reward functions a run may use, as the platform configured them."""

    registered: Mapping[str, str]
    """name -> `module:function`: built-ins, then entry points, then `ALIGNFLOW_REWARD_FUNCTIONS`."""
    module_prefixes: tuple[str, ...] = ()
    """Module prefixes (`ALIGNFLOW_ALLOWED_REWARD_MODULES`) whose functions may be named directly."""

    def describe(self) -> str:
        """`tiny_addition, exact_match; modules under acme_rewards`: what an error message lists."""
        text = ", ".join(sorted(self.registered))
        if self.module_prefixes:
            text += "; modules under " + ", ".join(self.module_prefixes)
        return text

    def target_of(self, spec: str, key: str = "reward.function") -> str:
        """The `module:function` that `spec` (a name or an allowed import path) may load; ConfigError naming
        the config `key` if none."""
        if spec in self.registered:
            return self.registered[spec]
        if _TARGET.fullmatch(spec) and (spec in self.registered.values() or self._is_allowed_module(spec)):
            return spec
        raise ConfigError(
            f"{key} is {spec!r}, which is not an allowed reward function; allowed: {self.describe()} "
            f"(the platform registers more as `{ENTRY_POINT_GROUP}` entry points or in {FUNCTIONS_ENV}, "
            f"and allows module prefixes in {MODULES_ENV})")

    def _is_allowed_module(self, target: str) -> bool:
        module = target.partition(":")[0]
        return any(module.startswith(prefix) if prefix.endswith(".") else module == prefix or
                   module.startswith(prefix + ".") for prefix in self.module_prefixes)


def read_reward_allow_list(environ: Mapping[str, str] | None = None) -> RewardAllowList:
    """The allow-list from the built-ins, installed entry points and the platform's environment."""
    environ = os.environ if environ is None else environ
    registered = dict(BUILTIN_REWARDS)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        registered[entry.name] = f"{entry.module}:{entry.attr}"
    registered.update(_parse_functions(environ.get(FUNCTIONS_ENV, "")))
    return RewardAllowList(MappingProxyType(registered), _parse_prefixes(environ.get(MODULES_ENV, "")))


def _parse_functions(text: str) -> dict[str, str]:
    functions = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, target = (part.strip() for part in item.partition("="))
        if not _NAME.fullmatch(name) or not _TARGET.fullmatch(target):
            raise ConfigError(f"{FUNCTIONS_ENV}: {item!r} is not `name=module:function`")
        functions[name] = target
    return functions


def _parse_prefixes(text: str) -> tuple[str, ...]:
    prefixes = tuple(filter(None, (part.strip() for part in text.split(","))))
    for prefix in prefixes:
        if not _PREFIX.fullmatch(prefix):
            raise ConfigError(f"{MODULES_ENV}: {prefix!r} is not a module prefix like `acme.rewards`")
    return prefixes


def resolve_reward_function(spec: str, allow_list: RewardAllowList | None = None,
                            key: str = "reward.function") -> RewardFunction:
    """Check `spec` against the allow-list, then import it.

    Args:
        spec: A registered name (`tiny_addition`) or an allowed `module:function`.
        allow_list: Default: `read_reward_allow_list()` (built-ins, entry points, environment).
        key: The config key `spec` came from, named in errors (`reward.sources.0.name`).

    Returns:
        The function and how to call it.

    Raises:
        ConfigError: `spec` is not allowed, cannot be imported, or is not callable.
    """
    allow_list = read_reward_allow_list() if allow_list is None else allow_list
    target = allow_list.target_of(spec, key)  # refuse before importing anything
    module_name, _, attribute = target.partition(":")
    try:
        function: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            function = getattr(function, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{key} {spec!r}: cannot import {target}: {err}") from err
    if not callable(function):
        raise ConfigError(f"{key} {spec!r}: {target} is not callable")
    return RewardFunction(spec, target, function, bool(getattr(function, "alignflow_batched", False)))
