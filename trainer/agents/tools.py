"""Function tools: Python callables the model calls by name, with checked arguments and bounded calls.

A tool is a `Tool` (name, JSON-schema parameters, the callable); `as_tool` builds one from a plain
function's signature (int, float, str, bool, list and dict parameters) and docstring. `ToolBox`
calls tools for an environment: it validates the arguments against the schema, runs the call on a
daemon thread with a deadline, turns whatever goes wrong (unknown tool, bad arguments, an
exception, the deadline) into an error text for the model, and cuts long output with a marker.
Nothing a tool does crashes the run. A hung Python call cannot be killed from Python: its thread is
abandoned (and the run's process ends it); code that may hang belongs in the sandbox (`python`).

The built-in `python` tool runs the model's code in `trainer.sandbox` (docs/sandbox.md): the sandbox
`environment.sandbox` names, once `bind_code_tools` has proved it with a canary program at start-up.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from trainer.errors import ConfigError

_JSON_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
                               dict: "object"}
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {"integer": (int,), "number": (int, float), "string": (str,),
                                              "boolean": (bool,), "array": (list,), "object": (dict,)}
CUT_MARKER = "\n[... output cut: {count} more characters]"


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call.

    Attributes:
        name: What the model calls it by.
        function: Called with the parsed arguments as keywords; its result becomes the observation text
            (strings as they are, anything else as JSON).
        description: One line for the chat template's tool list.
        parameters: JSON schema of the arguments: `{"type": "object", "properties": {...}, "required": [...]}`.
    """

    name: str
    function: Callable[..., Any]
    description: str
    parameters: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style definition chat templates take (`tools=[...]`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


def as_tool(value: Any, name: str) -> Tool:
    """`value` if it is a `Tool`, else a `Tool` named `name` built from a function's signature and docstring.

    Raises:
        ConfigError: A parameter has no annotation of a JSON type (int, float, str, bool, list, dict).
    """
    if isinstance(value, Tool):
        return value
    hints = inspect.get_annotations(value, eval_str=True)
    properties, required = {}, []
    for parameter in inspect.signature(value).parameters.values():
        json_type = _JSON_TYPES.get(hints.get(parameter.name))
        if json_type is None:
            raise ConfigError(f"tool {name!r}: parameter {parameter.name!r} needs an annotation of int, float, str, "
                              "bool, list or dict")
        properties[parameter.name] = {"type": json_type}
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    description = (inspect.getdoc(value) or name).splitlines()[0]
    return Tool(name, value, description, {"type": "object", "properties": properties, "required": required})


def argument_problem(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` do not fit `tool`'s schema, or None."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, found {type(arguments).__name__}"
    properties = tool.parameters.get("properties", {})
    missing = [key for key in tool.parameters.get("required", []) if key not in arguments]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    for key, value in arguments.items():
        if key not in properties:
            return f"unknown argument {key!r}; {tool.name} takes {', '.join(properties) or 'none'}"
        expected = properties[key].get("type")
        allowed = _PYTHON_TYPES.get(expected)
        is_bool_for_number = isinstance(value, bool) and expected in ("integer", "number")
        if allowed is not None and (not isinstance(value, allowed) or is_bool_for_number):
            return f"argument {key!r} must be {expected}, found {type(value).__name__}"
    return None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What one call gave the model: the observation text, whether it is an error, and how long it took."""

    content: str
    is_error: bool
    seconds: float = 0.0


class ToolBox:
    """An environment's tools, called safely.

    Args:
        tools: The tools, by their names.
        timeout_seconds: How long one call may run before it becomes a timeout error.
        max_output_chars: Longer results are cut to this many characters, followed by `CUT_MARKER`.
    """

    def __init__(self, tools: Sequence[Tool], timeout_seconds: float = 10.0, max_output_chars: int = 2000) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_seconds = timeout_seconds
        self.max_output_chars = max_output_chars

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools.values()]

    def call(self, name: Any, arguments: Any) -> ToolResult:
        """Call tool `name` with `arguments`; every failure is an error result, never an exception."""
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return ToolResult(f"error: unknown tool {name!r}; available: {', '.join(self.tools) or 'none'}", True)
        problem = argument_problem(tool, arguments)
        if problem is not None:
            return ToolResult(f"error: {tool.name}: {problem}", True)
        start = time.perf_counter()
        ok, value = self._run_with_deadline(tool, arguments)
        seconds = time.perf_counter() - start
        if not ok:
            return ToolResult(f"error: {tool.name}: {value}", True, seconds)
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(self.cut(text), False, seconds)

    def cut(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[:self.max_output_chars] + CUT_MARKER.format(count=len(text) - self.max_output_chars)

    def _run_with_deadline(self, tool: Tool, arguments: dict) -> tuple[bool, Any]:
        """(True, result) or (False, why) within `timeout_seconds`; a call past it is abandoned on its thread."""
        outcome: list[tuple[bool, Any]] = []

        def work() -> None:
            try:
                outcome.append((True, tool.function(**arguments)))
            except Exception as err:  # noqa: BLE001 - the model reads it as an observation
                first_line = str(err).splitlines()[0] if str(err) else ""
                outcome.append((False, f"{type(err).__name__}: {first_line}"))

        thread = threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_seconds)
        if not outcome:
            return False, f"timed out after {self.timeout_seconds:g} s"
        return outcome[0]


def check_requirements(tool: Tool) -> None:
    """ConfigError at start-up when a tool needs a package this image lacks (`alignflow_requires`)."""
    required = getattr(tool.function, "alignflow_requires", None)
    if required and find_spec(required) is None:
        raise ConfigError(f"environment.tools: tool {tool.name!r} needs {required}, which is not installed here")


# -- the built-in code tool -------------------------------------------------------------------------


def python(code: str) -> str:
    """Run Python code in a sandbox (no network, no credentials, a scratch folder) and return its output."""
    from trainer.config.environment import default_tool_sandbox
    from trainer.sandbox import build_sandbox  # the sandbox package: docs/sandbox.md

    config = default_tool_sandbox()  # unbound (called outside an environment): the local sandbox, tool limits
    return describe_run(build_sandbox(config).run_python(code, limits=config.limits), config.limits.wall_seconds)


python.alignflow_requires = "trainer.sandbox"
python.alignflow_runs_code = True  # `bind_code_tools` points it at `environment.sandbox`


def describe_run(result: Any, wall_seconds: float) -> str:
    """A sandbox result as the model reads it: stdout, then stderr and how the run ended, where notable."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr}")
    if result.timed_out:
        parts.append(f"[timed out after {wall_seconds:g} s]")
    elif result.memory_exceeded:
        parts.append("[stopped: memory limit]")
    elif result.scratch_exceeded:
        parts.append("[stopped: file space limit]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code {result.exit_code}]")
    if result.truncated:
        parts.append("[output cut]")
    return "\n".join(part for part in parts if part)


def bind_code_tools(tools: Mapping[str, Tool], config: Any) -> dict[str, Tool]:
    """`tools` with each tool that runs code (`alignflow_runs_code`) running it in the sandbox `config` names.

    The sandbox is built once and proved with its canary program (`Sandbox.check`) first, so a run whose code
    tool could not run code stops here, naming what is missing, instead of answering every call with an error.

    Args:
        tools: The environment's tools, by name.
        config: The `environment.sandbox` section (`SandboxConfig`).

    Raises:
        ConfigError: The sandbox cannot start or does not hold here (`environment.sandbox: ...`).
    """
    if not any(getattr(tool.function, "alignflow_runs_code", False) for tool in tools.values()):
        return dict(tools)
    from trainer.sandbox import SandboxError, build_sandbox

    try:
        sandbox = build_sandbox(config)
        sandbox.check(config.limits)
    except SandboxError as err:
        raise ConfigError(f"environment.sandbox: {err}") from None

    def run_code(code: str) -> str:
        return describe_run(sandbox.run_python(code, limits=config.limits), config.limits.wall_seconds)

    return {name: Tool(tool.name, run_code, tool.description, tool.parameters)
            if getattr(tool.function, "alignflow_runs_code", False) else tool for name, tool in tools.items()}
