"""Row schemas of the four dataset kinds, checked before tokenization.

- SFT: `messages` (a list of `{role, content}` with at least one assistant turn; assistant turns may carry
  OpenAI-style `tool_calls`, whose content may then be empty or null, and `tool` turns their results), or
  `prompt` + `completion` (both strings, or both lists of messages). The text trained on (the
  completion, or the assistant turns) must not be empty or blank: such a row teaches nothing but
  to stop, and is usually a broken export.
- preference: `prompt`, `chosen`, `rejected` (strings, or lists of messages); optional number `margin`.
  A string `chosen` or `rejected` may be empty (a refusal to answer): it is then just EOS.
- unpaired (KTO): `prompt`, `completion` (both strings, or both lists of messages), `label` (true for
  a desirable completion, false for an undesirable one).
- prompts: `prompt` (string or messages); optional `answer` (string).
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def _check_messages(value: Any, field: str) -> str | None:
    if not isinstance(value, list) or not value:
        return f"{field} must be a non-empty list of messages"
    for index, message in enumerate(value):
        if not isinstance(message, dict) or set(message) - MESSAGE_KEYS or "role" not in message:
            return f"{field}[{index}] must be an object with 'role' and 'content' (and, for tools, {TOOL_KEYS})"
        if message["role"] not in ROLES:
            return f"{field}[{index}].role is {message['role']!r}, expected one of {list(ROLES)}"
        calls = message.get("tool_calls")
        if calls is not None:
            problem = _check_tool_calls(calls, f"{field}[{index}].tool_calls", message["role"])
            if problem:
                return problem
        if not isinstance(message.get("content"), str) and not (calls and message.get("content") is None):
            return f"{field}[{index}].content must be a string"
    return None


MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id", "name"}
TOOL_KEYS = "'tool_calls' on assistant turns, 'tool_call_id' and 'name' on tool turns"


def _check_tool_calls(calls: Any, where: str, role: str) -> str | None:
    """Why OpenAI-style `tool_calls` are invalid: a list of {"function": {"name": str, "arguments": object}}."""
    if role != "assistant":
        return f"{where}: only assistant turns call tools"
    if not isinstance(calls, list) or not calls:
        return f"{where} must be a non-empty list"
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return f"{where}[{number}].function.arguments is a string that is not JSON"
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not isinstance(arguments,
                                                                                                          dict):
            return f"{where}[{number}] must be {{\"function\": {{\"name\": str, \"arguments\": object}}}}"
    return None


RESPONSE_FIELDS = ("completion", "chosen", "rejected")


def _check_text_or_messages(row: dict, field: str) -> str | None:
    value = row.get(field)
    if value is None:
        return f"missing field {field!r}"
    if isinstance(value, str):
        # An empty preference response is a real answer (just EOS), e.g. a refusal; a prompt is not (nor is an
        # SFT completion: `_check_trained_text`).
        return None if value or field in RESPONSE_FIELDS else f"{field} is empty"
    return _check_messages(value, field)


def check_sft_row(row: Any) -> str | None:
    """Return why `row` is not a valid SFT row, or None."""
    if not isinstance(row, dict):
        return f"expected an object, found {type(row).__name__}"
    # Columnar files (Parquet, datasets) give a missing column as None: treat it as absent.
    if row.get("messages") is not None:
        return _check_messages(row["messages"], "messages") or _check_trained_text(row["messages"], "messages")
    if row.get("prompt") is not None or row.get("completion") is not None:
        problem = _check_text_or_messages(row, "prompt") or _check_text_or_messages(row, "completion")
        if problem is None and isinstance(row["prompt"], str) != isinstance(row["completion"], str):
            problem = "prompt and completion must both be strings or both be message lists"
        return problem or _check_trained_text(row["completion"], "completion")
    return "expected 'messages', or 'prompt' and 'completion'"


def _check_trained_text(value: str | list[dict], field: str) -> str | None:
    """Why an SFT row's trained text (a string, or the assistant turns of a message list) is empty, or None."""
    texts = [value] if isinstance(value, str) else [(m.get("content") or "") + ("call" if m.get("tool_calls") else "")
                                                   for m in value if m["role"] == "assistant"]
    if not texts:
        return f"{field} has no assistant turn to train on"
    if any(text.strip() for text in texts):
        return None
    where = field if isinstance(value, str) else f"every assistant turn of {field}"
    return f"{where} is empty: nothing to train on"


def check_preference_row(row: Any) -> str | None:
    """Return why `row` is not a valid preference row, or None."""
    if not isinstance(row, dict):
        return f"expected an object, found {type(row).__name__}"
    for field in ("prompt", "chosen", "rejected"):
        problem = _check_text_or_messages(row, field)
        if problem:
            return problem
    if len({isinstance(row[f], str) for f in ("prompt", "chosen", "rejected")}) > 1:
        return "prompt, chosen and rejected must all be strings or all be message lists"
    margin = row.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
        return f"margin is {margin!r}, expected a number"
    return None


def check_unpaired_row(row: Any) -> str | None:
    """Return why `row` is not a valid unpaired-feedback row (KTO), or None."""
    if not isinstance(row, dict):
        return f"expected an object, found {type(row).__name__}"
    problem = _check_text_or_messages(row, "prompt") or _check_text_or_messages(row, "completion")
    if problem is None and isinstance(row["prompt"], str) != isinstance(row["completion"], str):
        problem = "prompt and completion must both be strings or both be message lists"
    if problem is None and not isinstance(row.get("label"), bool):
        problem = f"label is {row.get('label')!r}, expected true (desirable) or false (undesirable)"
    return problem


def check_prompt_row(row: Any) -> str | None:
    """Return why `row` is not a valid prompt row, or None."""
    if not isinstance(row, dict):
        return f"expected an object, found {type(row).__name__}"
    problem = _check_text_or_messages(row, "prompt")
    if problem is None and row.get("answer") is not None and not isinstance(row["answer"], str):
        problem = f"answer is {row['answer']!r}, expected a string"
    return problem
