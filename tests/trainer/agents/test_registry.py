"""Environments and tools resolve only through the platform's allow-list."""

import sys

import pytest

from trainer.agents.environment import ToolEnvironment
from trainer.allow_list import ENVIRONMENTS, TOOLS, read_allow_list, resolve
from trainer.errors import ConfigError


def test_builtins_resolve():
    assert issubclass(resolve(ENVIRONMENTS, "tools", {}), ToolEnvironment)
    assert resolve(TOOLS, "calculator", {})("2*3") == "6"


def test_a_name_off_the_list_is_refused_before_anything_is_imported():
    sys.modules.pop("tests.trainer.agents.environments", None)
    with pytest.raises(ConfigError, match=r"^environment.name is 'tests.trainer.agents.environments:EchoEnvironment', "
                                          r"which is not an allowed environment; allowed: tiny_calculator, tools"):
        resolve(ENVIRONMENTS, "tests.trainer.agents.environments:EchoEnvironment", {})
    assert "tests.trainer.agents.environments" not in sys.modules
    with pytest.raises(ConfigError, match="^environment.tools is 'os:system', which is not an allowed tool"):
        resolve(TOOLS, "os:system", {})


def test_the_platform_registers_names_and_module_prefixes():
    environ = {"ALIGNFLOW_ENVIRONMENTS": "echo=tests.trainer.agents.environments:EchoEnvironment",
               "ALIGNFLOW_ALLOWED_TOOL_MODULES": "tests.trainer.agents"}
    assert resolve(ENVIRONMENTS, "echo", environ).__name__ == "EchoEnvironment"
    assert resolve(TOOLS, "tests.trainer.agents.environments:hang", environ).__name__ == "hang"
    with pytest.raises(ConfigError, match="not an allowed tool"):
        resolve(TOOLS, "tests.trainer_evil:x", environ)


def test_a_malformed_registration_is_named():
    with pytest.raises(ConfigError, match="ALIGNFLOW_TOOLS: 'calc' is not `name=module:attribute`"):
        read_allow_list(TOOLS, {"ALIGNFLOW_TOOLS": "calc"})
