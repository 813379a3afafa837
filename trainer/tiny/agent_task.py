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
the episodes. The first 64 problems of a fixed shuffle are held out for evaluation.

The traces come from a teacher with a bad habit, which SFT copies and reinforcement learning has to
unlearn: when the first number is even, it mostly writes the product as `36x48`. The calculator
rejects that (an invalid tool call), and the teacher then answers from memory, which the tiny model
cannot do. So SFT's model makes invalid calls and wrong answers on many of those problems, and an
episode that writes `*` there is the only way to the reward.
"""

from __future__ import annotations

import ast
import operator
import random
from pathlib import Path

from trainer.agents.environment import ToolEnvironment
from trainer.agents.tools import ToolBox, as_tool
from trainer.tiny.task import write_jsonl

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod}
MAX_EXPRESSION_CHARS = 64


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression (+, -, *, //, %, parentheses)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:  # Python's message is long, and an episode's tokens are few
        raise ValueError("not arithmetic") from None
    return str(_evaluate(tree.body))


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


# The teacher's habit: on problems whose first number ends in one of these digits, it writes `x` for `*` in
# this share of its traces (decided per problem, the same on every run). Above a half, so SFT's greedy
# call has the habit; well below one, so a sampled episode at the presets' temperature writes `*` often
# enough for GRPO to find the reward. Half the problems (every even first number), so what GRPO can win
# back is large enough for the gate to confirm on 64 held-out products with one greedy episode each; with
# the habit on 0 and 5 only (a fifth), the gains, +0.05 to +0.14, were too small to confirm on every seed
# (benchmarks/tiny_preset.md).
HABIT_DIGITS = "02468"
HABIT_SHARE = 0.6


_TEACHER_TOOLS = ToolBox([as_tool(calculator, "calculator")])  # what the teacher's calls get, as an episode's would


def teacher_slips(prompt: str) -> bool:
    """Whether the teacher's trace of `prompt` writes the call with `x` (its habit)."""
    return prompt.split("*")[0][-1] in HABIT_DIGITS and random.Random(prompt).random() < HABIT_SHARE


def trace(prompt: str, answer: str) -> dict:
    """The teacher's SFT conversation of one problem: the call, the tool's result, the answer.

    When the teacher slips, its call gets the calculator's error (the same text an episode would see),
    and it answers from memory."""
    expression = prompt[:-1].replace("*", "x") if teacher_slips(prompt) else prompt[:-1]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    result = _TEACHER_TOOLS.call("calculator", {"expression": expression}).content
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "content": result},
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

