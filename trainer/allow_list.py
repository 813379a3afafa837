"""What a run may load by name: reward functions, environments and tools, each through the platform's allow-list.

`reward.function`, `environment.name` and `environment.tools` come from a config or a pipeline
parameter, that is from whoever submits a run. Importing whatever `module:attribute` they name
would let them call any callable in the image with arguments the data controls (`os:execl` with a
prompt `/usr/bin/touch` replaced the trainer by `touch`). So a name resolves only through an
allow-list the platform team controls, and nothing is imported before the name is found on it:

- built-ins (`REWARDS`, `ENVIRONMENTS` and `TOOLS` below);
- entry points of installed packages, that is whatever the trainer image installs, in the groups
  `alignflow.rewards`, `alignflow.environments` and `alignflow.tools`
  (`[project.entry-points."alignflow.tools"] search = "acme_tools.web:search"`);
- `ALIGNFLOW_REWARD_FUNCTIONS`, `ALIGNFLOW_ENVIRONMENTS`, `ALIGNFLOW_TOOLS`: comma-separated
  `name=module:attribute` (the chart's ConfigMap, `policy.rewardFunctions`, `policy.environments`,
  `policy.tools`);
- `ALIGNFLOW_ALLOWED_REWARD_MODULES`, `ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES`,
  `ALIGNFLOW_ALLOWED_TOOL_MODULES`: module prefixes whose attributes may be named directly as
  `module:attribute`. A prefix matches whole dotted parts: `acme` allows `acme` and `acme.x`, not
  `acme_evil`.

Later sources override earlier ones for the same name, and a registered target may also be named by
its own `module:attribute`. Anything else is a `ConfigError` of one line listing the allowed names.
The launcher passes these variables on to the training job's pods (`ALLOW_LIST_VARIABLES`), since
the names are resolved there.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from trainer.errors import ConfigError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\.?")


@dataclass(frozen=True, slots=True)
class RegistryKind:
    """Where one kind of named object is registered and how a config asks for it."""

    key: str
    """The config key that names one (`environment.name`), for error messages."""
    noun: str
    """What one is called in an error message (`environment`)."""
    builtins: Mapping[str, str]
    entry_point_group: str
    names_env: str
    modules_env: str


# The tiny addition task's checker is also accepted under its import path, `trainer.tiny.task:reward`, as a
# registered target may be: existing pipelines and configs use it.
REWARDS = RegistryKind("reward.function", "reward function", MappingProxyType({
    "tiny_addition": "trainer.tiny.task:reward",
    "tiny_calculator": "trainer.tiny.agent_task:reward",
}), "alignflow.rewards", "ALIGNFLOW_REWARD_FUNCTIONS", "ALIGNFLOW_ALLOWED_REWARD_MODULES")
ENVIRONMENTS = RegistryKind("environment.name", "environment", MappingProxyType({
    "tiny_calculator": "trainer.tiny.agent_task:CalculatorEnvironment",
    "tools": "trainer.agents.environment:ToolEnvironment",
}), "alignflow.environments", "ALIGNFLOW_ENVIRONMENTS", "ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES")
TOOLS = RegistryKind("environment.tools", "tool", MappingProxyType({
    "calculator": "trainer.tiny.agent_task:calculator",
    "python": "trainer.agents.tools:python",
}), "alignflow.tools", "ALIGNFLOW_TOOLS", "ALIGNFLOW_ALLOWED_TOOL_MODULES")
# The variables the platform sets them in: the component pods get them from the chart's ConfigMap and the launcher
# passes them on to the training job, where the names are resolved.
ALLOW_LIST_VARIABLES = tuple(name for kind in (REWARDS, ENVIRONMENTS, TOOLS) for name in (kind.names_env,
                                                                                           kind.modules_env))


@dataclass(frozen=True, slots=True)
class AllowList:
    """The names of one kind a run may use, as the platform configured them."""

    kind: RegistryKind
    registered: Mapping[str, str]
    """name -> `module:attribute`: built-ins, then entry points, then the platform's variable."""
    module_prefixes: tuple[str, ...] = ()

    def describe(self) -> str:
        """`tiny_addition, exact_match; modules under acme_rewards`: what an error message lists."""
        text = ", ".join(sorted(self.registered))
        if self.module_prefixes:
            text += "; modules under " + ", ".join(self.module_prefixes)
        return text

    def target_of(self, spec: str, key: str | None = None) -> str:
        """The `module:attribute` `spec` may load; ConfigError naming the config `key` and the allowed ones if none."""
        if spec in self.registered:
            return self.registered[spec]
        if _TARGET.fullmatch(spec) and (spec in self.registered.values() or self._is_allowed_module(spec)):
            return spec
        kind = self.kind
        raise ConfigError(
            f"{key or kind.key} is {spec!r}, which is not an allowed {kind.noun}; allowed: {self.describe()} (the "
            f"platform registers more as `{kind.entry_point_group}` entry points or in {kind.names_env}, and allows "
            f"module prefixes in {kind.modules_env})")

    def load(self, spec: str, key: str | None = None) -> tuple[str, Any]:
        """Check `spec`, then import it: its `module:attribute` and the callable.

        Raises:
            ConfigError: `spec` is not allowed, cannot be imported, or is not callable.
        """
        key = key or self.kind.key
        target = self.target_of(spec, key)  # refuse before importing anything
        module_name, _, attribute = target.partition(":")
        try:
            value: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"{key} {spec!r}: cannot import {target}: {err}") from err
        if not callable(value):
            raise ConfigError(f"{key} {spec!r}: {target} is not callable")
        return target, value

    def _is_allowed_module(self, target: str) -> bool:
        module = target.partition(":")[0]
        return any(module.startswith(prefix) if prefix.endswith(".") else module == prefix or
                   module.startswith(prefix + ".") for prefix in self.module_prefixes)


def read_allow_list(kind: RegistryKind, environ: Mapping[str, str] | None = None) -> AllowList:
    """The allow-list of `kind` from the built-ins, installed entry points and the platform's environment.

    Raises:
        ConfigError: a variable is malformed (named in the message).
    """
    environ = os.environ if environ is None else environ
    registered = dict(kind.builtins)
    for entry in entry_points(group=kind.entry_point_group):
        registered[entry.name] = f"{entry.module}:{entry.attr}"
    for item in filter(None, (part.strip() for part in environ.get(kind.names_env, "").split(","))):
        name, _, target = (part.strip() for part in item.partition("="))
        if not _NAME.fullmatch(name) or not _TARGET.fullmatch(target):
            raise ConfigError(f"{kind.names_env}: {item!r} is not `name=module:attribute`")
        registered[name] = target
    prefixes = tuple(filter(None, (part.strip() for part in environ.get(kind.modules_env, "").split(","))))
    for prefix in prefixes:
        if not _PREFIX.fullmatch(prefix):
            raise ConfigError(f"{kind.modules_env}: {prefix!r} is not a module prefix like `acme.tools`")
    return AllowList(kind, MappingProxyType(registered), prefixes)


def resolve(kind: RegistryKind, spec: str, environ: Mapping[str, str] | None = None) -> Any:
    """Check `spec` against `kind`'s allow-list, then import what it names (ConfigError if it may not)."""
    return read_allow_list(kind, environ).load(spec)[1]
