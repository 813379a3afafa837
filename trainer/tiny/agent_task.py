"""A tiny tool-use task: two-digit multiplication with a calculator tool.

Prompts are `"37*48="`. The tiny model cannot multiply two-digit numbers, but it can learn to call
the calculator and copy its answer:

    user:      37*48=
    assistant: <tool_call>{"name":"calculator","arguments":{"expression":"37*48"}}</tool_call>
    tool:      1776
    assistant: 1776

SFT rows are such conversations (OpenAI-style `tool_calls` and `tool` messages; only the assistant
turns are trained), prompt rows carry the answer for the reward (`tiny_calculator`: the last turn
is exactly the product), and `CalculatorEnvironment` (built-in environment `tiny_calculator`) runs
the episodes. Every fifth problem of a fixed shuffle is held out for evaluation.
"""

from __future__ import annotations

import ast
import operator
import random
from pathlib import Path

from trainer.agents.environment import ToolEnvironment
from trainer.tiny.task import write_jsonl

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod}
MAX_EXPRESSION_CHARS = 64


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression (+, -, *, //, %, parentheses)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    return str(_evaluate(ast.parse(expression, mode="eval").body))


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(f"unsupported expression element {type(node).__name__}")


class CalculatorEnvironment(ToolEnvironment):
    """The tiny task's environment: tool calls answered by the calculator, the first plain turn is the answer."""

    default_tools = ("calculator",)


def check_answer(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer else 0.0


def reward(prompt: str, completion: str, answer: str | None) -> float:
    """The built-in reward `tiny_calculator`: 1 when the episode's last turn is exactly the product."""
    return check_answer(completion, answer or "")


def problems(seed: int = 0) -> list[tuple[str, str]]:
    """Every two-digit product, in a fixed shuffled order."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    return [(f"{a}*{b}=", str(a * b)) for a, b in pairs]


def trace(prompt: str, answer: str) -> dict:
    """The SFT conversation of one problem: the call, the tool's result, the answer."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": prompt[:-1]}}}
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "content": answer},
                         {"role": "assistant", "content": answer}]}


def write_agent_task(directory: str | Path, num_train: int = 2000, num_eval: int = 64) -> dict[str, Path]:
    """Write the task's SFT traces and prompt rows as JSONL; returns their paths by name."""
    directory = Path(directory)
    items = problems()
    held_out, train = items[:num_eval], items[num_eval:num_eval + num_train]
    rows = {"sft_train": [trace(p, a) for p, a in train[:num_train // 2]],
            "sft_eval": [trace(p, a) for p, a in held_out],
            "prompts": [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in train],
            "eval_prompts": [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in held_out]}
    return {name: write_jsonl(content, directory / f"{name}.jsonl") for name, content in rows.items()}

