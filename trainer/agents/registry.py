"""Which environments and tools a run may use: built-ins, the platform's registrations, allowed modules.

`environment.name` and `environment.tools` come from a config or a pipeline parameter, that is from
whoever submits a run, so (as with reward functions, `trainer.online.reward_registry`) a name
resolves only through an allow-list the platform team controls, and nothing is imported before
the name is found on it:

- built-ins (`BUILTIN_ENVIRONMENTS`, `BUILTIN_TOOLS`);
- entry points of installed packages in the groups `alignflow.environments` and `alignflow.tools`
  (`[project.entry-points."alignflow.tools"] search = "acme_tools.web:search"`);
- `ALIGNFLOW_ENVIRONMENTS` / `ALIGNFLOW_TOOLS`: comma-separated `name=module:attribute` (the chart's
  ConfigMap, `policy.environments` and `policy.tools`);
- `ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES` / `ALIGNFLOW_ALLOWED_TOOL_MODULES`: module prefixes whose
  attributes may be named directly as `module:attribute` (whole dotted parts: `acme` allows `acme.x`,
  not `acme_evil`).

Later sources override earlier ones for the same name. An environment target is an `Environment`
subclass (or any callable returning one); a tool target is a Python function (wrapped by
`trainer.agents.tools.as_tool`) or a ready `Tool`.
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
    """Where one kind of named object (environments, tools) is registered and how it is asked for."""

    key: str
    """The config key that names one (`environment.name`), for error messages."""
    builtins: Mapping[str, str]
    entry_point_group: str
    names_env: str
    modules_env: str


BUILTIN_ENVIRONMENTS: Mapping[str, str] = MappingProxyType({
    "tiny_calculator": "trainer.tiny.agent_task:CalculatorEnvironment",
    "tools": "trainer.agents.environment:ToolEnvironment",
})
BUILTIN_TOOLS: Mapping[str, str] = MappingProxyType({
    "calculator": "trainer.tiny.agent_task:calculator",
    "python": "trainer.agents.tools:python",
})
ENVIRONMENTS = RegistryKind("environment.name", BUILTIN_ENVIRONMENTS, "alignflow.environments",
                            "ALIGNFLOW_ENVIRONMENTS", "ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES")
TOOLS = RegistryKind("environment.tools", BUILTIN_TOOLS, "alignflow.tools", "ALIGNFLOW_TOOLS",
                     "ALIGNFLOW_ALLOWED_TOOL_MODULES")


@dataclass(frozen=True, slots=True)
class AllowList:
    """The names of one kind a run may use, as the platform configured them."""

    kind: RegistryKind
    registered: Mapping[str, str]
    """name -> `module:attribute`: built-ins, then entry points, then the environment variable."""
    module_prefixes: tuple[str, ...] = ()

    def describe(self) -> str:
        text = ", ".join(sorted(self.registered))
        if self.module_prefixes:
            text += "; modules under " + ", ".join(self.module_prefixes)
        return text

    def target_of(self, spec: str) -> str:
        """The `module:attribute` `spec` may load; ConfigError naming the allowed ones otherwise."""
        if spec in self.registered:
            return self.registered[spec]
        if _TARGET.fullmatch(spec) and (spec in self.registered.values() or self._is_allowed_module(spec)):
            return spec
        kind = self.kind
        raise ConfigError(
            f"{kind.key}: {spec!r} is not on the platform's allow-list; allowed: {self.describe()} (the platform "
            f"registers more as `{kind.entry_point_group}` entry points or in {kind.names_env}, and allows module "
            f"prefixes in {kind.modules_env})")

    def _is_allowed_module(self, target: str) -> bool:
        module = target.partition(":")[0]
        return any(module.startswith(prefix) if prefix.endswith(".") else module == prefix or
                   module.startswith(prefix + ".") for prefix in self.module_prefixes)


def read_allow_list(kind: RegistryKind, environ: Mapping[str, str] | None = None) -> AllowList:
    """The allow-list of `kind` from the built-ins, installed entry points and the platform's environment."""
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
    """Check `spec` against `kind`'s allow-list, then import what it names.

    Raises:
        ConfigError: `spec` is not allowed, cannot be imported, or is not callable.
    """
    target = read_allow_list(kind, environ).target_of(spec)  # refuse before importing anything
    module_name, _, attribute = target.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{kind.key}: {spec!r}: cannot import {target}: {err}") from err
    if not callable(value):
        raise ConfigError(f"{kind.key}: {spec!r}: {target} is not callable")
    return value
