"""Function tools: schemas from signatures, checked arguments, and every failure as an error observation."""

import time

import pytest

from tests.trainer.agents.environments import hang
from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.agents.tools import CUT_MARKER, Tool, ToolBox, argument_problem, as_tool, check_requirements
from trainer.errors import ConfigError
from trainer.tiny.agent_task import calculator


def add(a: int, b: int, note: str = "") -> int:
    """Add two integers."""
    return a + b


def test_as_tool_builds_the_schema_from_the_signature():
    tool = as_tool(add, "add")
    assert tool.schema() == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                        "note": {"type": "string"}}, "required": ["a", "b"]}}}


def test_a_parameter_without_a_json_type_is_a_config_error():
    def untyped(x):
        return x

    with pytest.raises(ConfigError, match="parameter 'x' needs an annotation"):
        as_tool(untyped, "untyped")


@pytest.mark.parametrize(("arguments", "problem"), [
    ({"a": 1}, "missing argument(s) b"),
    ({"a": 1, "b": 2, "c": 3}, "unknown argument 'c'"),
    ({"a": "1", "b": 2}, "argument 'a' must be integer, found str"),
    ({"a": True, "b": 2}, "argument 'a' must be integer, found bool"),
    ([1, 2], "arguments must be a JSON object, found list"),
])
def test_arguments_are_checked_against_the_schema(arguments, problem):
    assert problem in argument_problem(as_tool(add, "add"), arguments)


def test_good_calls_return_the_result_as_text():
    box = ToolBox([as_tool(add, "add"), as_tool(calculator, "calculator")])
    assert box.call("add", {"a": 2, "b": 3}).content == "5"
    assert box.call("calculator", {"expression": "37*48"}) .content == "1776"
    assert not box.call("add", {"a": 2, "b": 3}).is_error


def test_failures_become_error_observations_never_exceptions():
    def explode() -> str:
        raise ValueError("boom\nsecond line")

    box = ToolBox([as_tool(add, "add"), as_tool(explode, "explode"), as_tool(calculator, "calculator")])
    assert box.call("nope", {}).content == "error: unknown tool 'nope'; available: add, explode, calculator"
    assert box.call("add", {"a": 1}).content == "error: add: missing argument(s) b"
    assert box.call("explode", {}).content == "error: explode: ValueError: boom"
    assert box.call("calculator", {"expression": "__import__('os')"}).content.startswith("error: calculator: ")
    assert all(box.call(*call).is_error for call in [("nope", {}), ("explode", {}), (None, {})])


def test_huge_output_is_cut_with_a_marker():
    def flood() -> str:
        return "x" * 5_000_000

    result = ToolBox([as_tool(flood, "flood")], max_output_chars=100).call("flood", {})
    assert result.content == "x" * 100 + CUT_MARKER.format(count=5_000_000 - 100) and not result.is_error


def test_a_hanging_tool_times_out():
    box = ToolBox([as_tool(hang, "hang")], timeout_seconds=0.2)
    start = time.perf_counter()
    result = box.call("hang", {"seconds": 30.0})
    assert result.is_error and result.content == "error: hang: timed out after 0.2 s"
    assert time.perf_counter() - start < 2


def test_a_tool_needing_a_missing_package_fails_at_start_up():
    def needs() -> str:
        return ""

    needs.alignflow_requires = "no_such_package_for_alignflow"
    with pytest.raises(ConfigError, match="tool 'needs' needs no_such_package_for_alignflow"):
        check_requirements(Tool("needs", needs, "", {}))


def test_code_tool_runs_in_the_sandbox():
    skip_without_the_local_sandbox()
    from trainer.agents.tools import python

    box = ToolBox([as_tool(python, "python")], timeout_seconds=30)
    assert box.call("python", {"code": "print(6 * 7)"}).content.strip() == "42"
