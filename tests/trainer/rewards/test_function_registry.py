"""Tests for `trainer.rewards.function_registry` (and `trainer.allow_list`): only built-in, registered or explicitly allowed reward functions load."""

from __future__ import annotations

import sys

import pytest

from trainer.errors import ConfigError
from trainer.rewards.function_registry import read_reward_allow_list, resolve_reward_function
from trainer.tiny.task import reward as tiny_reward


def allow_list(**environ: str):
    return read_reward_allow_list(environ)


def test_built_in_resolves_by_name_and_by_its_import_path_alias():
    by_name = resolve_reward_function("tiny_addition", allow_list())
    alias = resolve_reward_function("trainer.tiny.task:reward", allow_list())
    assert by_name.function is alias.function is tiny_reward
    assert (by_name.target, by_name.is_batched) == ("trainer.tiny.task:reward", False)


@pytest.mark.parametrize("spec", ["os:execl", "subprocess:run", "builtins:eval", "trainer.tiny.task:problems",
                                  "antigravity:fly", "not a spec"])
def test_anything_else_is_refused_with_one_line_naming_the_allowed_functions(spec):
    with pytest.raises(ConfigError) as raised:
        resolve_reward_function(spec, allow_list(ALIGNFLOW_REWARD_FUNCTIONS="length=tests.trainer.online.rewards:length"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"reward.function is {spec!r}, which is not an allowed reward function; "
                              "allowed: length, tiny_addition")
    assert "antigravity" not in sys.modules  # refused before anything was imported


def test_platform_registers_names_in_the_environment():
    functions = allow_list(ALIGNFLOW_REWARD_FUNCTIONS=" length = tests.trainer.online.rewards:length ,"
                                                      "batched=tests.trainer.online.rewards:batched_length")
    assert resolve_reward_function("length", functions).function("p", "abc", None) == 3.0
    assert resolve_reward_function("batched", functions).is_batched
    # A registered target may be named by its import path too.
    assert resolve_reward_function("tests.trainer.online.rewards:length", functions).name == \
        "tests.trainer.online.rewards:length"


@pytest.mark.parametrize("entry", ["length", "length=", "=tests.x:y", "length=tests.trainer.online.rewards",
                                   "length=os:execl;rm"])
def test_malformed_registration_is_an_error_naming_the_variable(entry):
    with pytest.raises(ConfigError, match=r"^ALIGNFLOW_REWARD_FUNCTIONS: .* is not `name=module:attribute`$"):
        allow_list(ALIGNFLOW_REWARD_FUNCTIONS=entry)


@pytest.mark.parametrize(("prefixes", "allowed"), [
    ("tests.trainer", True), ("tests.trainer.online.rewards", True), ("tests.", True),
    ("tests.train", False), ("tests.trainer.online.rewards.sub", False), ("", False),
])
def test_allowed_module_prefixes_match_whole_dotted_parts(prefixes, allowed):
    functions = allow_list(ALIGNFLOW_ALLOWED_REWARD_MODULES=f"other,{prefixes}")
    spec = "tests.trainer.online.rewards:length"
    if allowed:
        assert resolve_reward_function(spec, functions).function.__name__ == "length"
    else:
        with pytest.raises(ConfigError, match="not an allowed reward function"):
            resolve_reward_function(spec, functions)


def test_allowed_module_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^reward.function 'tests.nowhere:f': cannot import tests.nowhere:f"):
        resolve_reward_function("tests.nowhere:f", allow_list(ALIGNFLOW_ALLOWED_REWARD_MODULES="tests"))


def test_installed_packages_register_entry_points(tmp_path, monkeypatch):
    # A real (if minimal) installed distribution on sys.path, as `pip install acme-rewards` would leave it.
    dist_info = tmp_path / "acme_rewards-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-rewards\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[alignflow.rewards]\nacme_length = tests.trainer.online.rewards:length\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    functions = read_reward_allow_list({})
    assert functions.registered["acme_length"] == "tests.trainer.online.rewards:length"
    assert resolve_reward_function("acme_length", functions).function("p", "ab", None) == 2.0
