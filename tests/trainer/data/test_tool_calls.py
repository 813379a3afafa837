"""Tool-call syntax, observation tokens, and SFT rows with tool calls."""

import pytest

from trainer.data.schemas import check_sft_row
from trainer.data.tokenize import IGNORE_INDEX, encode_sft
from trainer.data.tool_calls import ObservationEncoder, parse_tool_calls, plain_messages, render_tool_call
from trainer.tiny.agent_task import trace
from trainer.tiny.model import build_tokenizer


def test_parses_calls_and_reports_malformed_ones():
    text = ('<tool_call>{"name":"calculator","arguments":{"expression":"1+2"}}</tool_call>'
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{not json}</tool_call><tool_call>["f"]</tool_call><tool_call>{"name": "f"')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("calculator", {"expression": "1+2"}), ("f", {"x": 1})]
    assert calls[2].problem.startswith("the tool call is not valid JSON")
    assert calls[3].problem == 'a tool call must be {"name": "...", "arguments": {...}}'
    assert calls[4].problem == "a <tool_call> block is not closed with </tool_call>"
    assert parse_tool_calls("1776") == []


def test_rendered_calls_parse_back():
    (call,) = parse_tool_calls(render_tool_call("calculator", {"expression": "3*4"}))
    assert (call.name, call.arguments, call.problem) == ("calculator", {"expression": "3*4"}, None)


def test_observation_follows_the_chat_template_after_the_sampled_stop_token():
    encoder = ObservationEncoder(build_tokenizer())
    # The tiny template closes a turn with <|end|>, the stop token the model sampled: nothing of it is repeated.
    assert encoder.text([{"role": "tool", "content": "42"}], "<|end|>") == "<|tool|>42<|end|><|assistant|>"


def test_observation_without_a_chat_template_uses_the_plain_format():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    assert ObservationEncoder(tokenizer).text([{"role": "tool", "content": "42"}], "") == "\n<tool>\n42\n</tool>\n"


def test_sft_on_tool_conversations_trains_only_the_assistant_turns():
    tokenizer = build_tokenizer()
    row = trace("37*48=", "1776")
    assert check_sft_row(row) is None
    encoded = encode_sft(tokenizer, row, 256)
    trained = [i for i, label in zip(encoded["input_ids"], encoded["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained) == (
        '<tool_call>{"name":"calculator","arguments":{"expression":"37*48"}}</tool_call><|end|>1776<|end|>')
    assert tokenizer.decode(encoded["input_ids"]).count("<|tool|>1776<|end|>") == 1  # the tool turn is context


@pytest.mark.parametrize(("message", "problem"), [
    ({"role": "user", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
     "only assistant turns call tools"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]},
     "arguments is a string that is not JSON"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": {}}}]}, "must be"),
])
def test_bad_tool_calls_in_sft_rows_are_named(message, problem):
    assert problem in check_sft_row({"messages": [{"role": "user", "content": "q"}, message]})


def test_openai_string_arguments_become_plain_blocks():
    messages = [{"role": "assistant", "content": None,
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    assert plain_messages(messages) == [{"role": "assistant", "content": '<tool_call>{"name":"f","arguments":{"x":1}}'
                                                                         '</tool_call>'}]
