"""How tool calls and observations look as text and tokens.

Tool calls. A model turn calls tools with one or more blocks

    <tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>

(the Hermes / Qwen convention, which chat templates with `tools` support render the same way;
`arguments` may also be a JSON string holding the object, as OpenAI's API sends it). A turn with
no `<tool_call>` is the model's answer. A block that is not JSON, not an object with a string
`name` and object `arguments`, or not closed, is a malformed call: an error observation.

Observations. After a model turn, the environment's messages (role `tool` or `user`) are appended
as tokens: with a chat template, the text the template adds for those messages after an
assistant turn (rendered around a stand-in conversation, then tokenized on its own), ending
with the assistant header of the next turn; without one, the plain format
`PLAIN_OBSERVATION` per message followed by nothing. The model's own tokens are never
re-tokenized.

Training data. Conversations with OpenAI-style `tool_calls` on assistant messages render through
a template that supports them (its source mentions `tool_calls`) as they are; for any other
template, each call becomes a `<tool_call>` block appended to the assistant's content
(`plain_messages`), so SFT teaches exactly the syntax the rollout parses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trainer.errors import DataError

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.S)
PLAIN_OBSERVATION = "\n<{role}>\n{content}\n</{role}>\n"
_STAND_IN = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call, or the reason it could not be parsed (`problem`)."""

    name: Any = None
    arguments: Any = None
    problem: str | None = None


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The plain text of one call, as the model writes it (compact JSON)."""
    return TOOL_CALL_OPEN + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")) + TOOL_CALL_CLOSE


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls of a model turn, in order (empty: the turn is an answer)."""
    calls = []
    for block in _BLOCK.findall(text):
        try:
            value = json.loads(block)
        except json.JSONDecodeError as err:
            calls.append(ToolCall(problem=f"the tool call is not valid JSON ({err.msg} at character {err.pos})"))
            continue
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(arguments, dict):
            calls.append(ToolCall(problem='a tool call must be {"name": "...", "arguments": {...}}'))
            continue
        calls.append(ToolCall(value["name"], arguments))
    if text.count(TOOL_CALL_OPEN) > len(_BLOCK.findall(text)):
        calls.append(ToolCall(problem=f"a {TOOL_CALL_OPEN} block is not closed with {TOOL_CALL_CLOSE}"))
    return calls


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tool_calls` itself (else the plain format is used)."""
    return "tool_calls" in str(getattr(tokenizer, "chat_template", None) or "")


def plain_messages(messages: list[dict]) -> list[dict]:
    """Messages whose `tool_calls` are written into the content as `<tool_call>` blocks; only role and content kept."""
    plain = []
    for message in messages:
        content = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = function.get("arguments", {})
            content += render_tool_call(function["name"], json.loads(arguments) if isinstance(arguments, str)
                                        else arguments)
        plain.append({"role": message["role"], "content": content})
    return plain


def template_messages(tokenizer: Any, messages: list[dict]) -> list[dict]:
    """`messages` as this tokenizer's chat template takes them (`tool_calls` kept, or written as plain blocks)."""
    if supports_tools(tokenizer):
        return messages
    if any("tool_calls" in message or set(message) - {"role", "content"} for message in messages):
        return plain_messages(messages)
    return messages


class ObservationEncoder:
    """Token ids of the observations appended after a model turn, for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        if self.has_template:
            closed = self._render(_STAND_IN)
            # What the template writes after an assistant's content (`<|end|>`, `<|im_end|>\n`): the model
            # sampled its stop token; the rest of the closing, if any, belongs before the observation.
            self.closing = closed[closed.rindex(_STAND_IN[-1]["content"]) + 1:]

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(template_messages(self.tokenizer, messages), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def text(self, messages: list[dict], stop_text: str) -> str:
        """The observation text after a turn that ended with `stop_text` (the decoded stop token)."""
        if not self.has_template:
            return "".join(PLAIN_OBSERVATION.format(role=m["role"], content=m["content"]) for m in messages)
        before = self._render(_STAND_IN)
        after = self._render(_STAND_IN + messages, add_generation_prompt=True)
        if not after.startswith(before):
            raise DataError("the chat template does not render conversations prefix by prefix, so observations "
                            "cannot be appended to a model turn")
        rest = self.closing[len(stop_text):] if stop_text and self.closing.startswith(stop_text) else self.closing
        return rest + after[len(before):]

    def ids(self, messages: list[dict], stop_text: str) -> list[int]:
        text = self.text(messages, stop_text)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
