"""The environment interface: one episode per prompt row, answering each model turn.

Shaped after Trinity-RFT's workflows and TRL's environments. The rollout
(`trainer.rollout.multi_turn`) builds one environment per episode, calls `start(row)` with the prompt
row (its `prompt`, `answer` and any other columns), then, after every model turn, `step(text)`
with the turn's decoded text. `step` answers with an `Observation`: the messages the model reads
next (tool results as role `tool`, or a user message), a reward contribution, and whether the
episode is done. The rollout enforces the limits (turns, tokens per turn, total tokens); an
environment that never says done is cut by them and the episode is marked truncated.

The episode's score is the stage's reward source applied to the last model turn (`reward.function`
with the row's `answer`, or a reward model on the whole sequence) plus the sum of the environment's
reward contributions.

`ToolEnvironment` is the ready-made one (built-in name `tools`): a turn with `<tool_call>` blocks
(`trainer.data.tool_calls`) gets the calls' results as `tool` messages; a turn without calls is the
answer and ends the episode. Subclass it to change the reward or add a user turn; subclass
`Environment` for anything else. Environments are chosen by name from the platform's allow-list
(`trainer.allow_list`). `step` runs on a worker thread, concurrently with other episodes' steps
(at most `max_concurrent_steps` of them, where the class sets it) and, under the `as_ready`
schedule, with the model sampling other episodes' turns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from trainer.agents.tools import ToolBox
from trainer.data.tool_calls import parse_tool_calls


@dataclass(slots=True)
class Observation:
    """What an environment answers to a model turn.

    Attributes:
        messages: Appended to the conversation as observation tokens (never trained on): dicts with
            `role` (`tool` or `user`) and `content`. Ignored when `done`.
        reward: Added to the episode's score.
        done: The episode is over (the last model turn is its answer).
        num_tool_calls: Tool calls this turn made (metrics), errors included.
        num_tool_errors: Of those, the malformed, unknown, rejected, raising or timed-out ones.
        tool_seconds: Time spent inside tools.
    """

    messages: list[dict] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    tool_seconds: float = 0.0


class Environment(ABC):
    """One episode's world. Built once per episode with the run's tools.

    Args:
        tools: The tools this episode may call (`environment.tools`, or `default_tools`).
    """

    default_tools: tuple[str, ...] = ()
    """Registered tool names used when `environment.tools` is empty."""

    max_concurrent_steps: int | None = None
    """At most this many episodes of this environment step at once, whatever `environment.max_concurrent_episodes`
    allows (a service that takes few requests at a time, a sandbox with few slots); None sets no limit of its own."""

    def __init__(self, tools: ToolBox) -> None:
        self.tools = tools
        self.row: dict[str, Any] = {}

    def start(self, row: dict[str, Any]) -> None:
        """Begin the episode of prompt row `row` (kept as `self.row`)."""
        self.row = row

    @abstractmethod
    def step(self, turn: str) -> Observation:
        """Answer the model's turn `turn` (its decoded text, special tokens dropped)."""


class ToolEnvironment(Environment):
    """Runs the tool calls of each turn; the first turn without calls is the answer and ends the episode."""

    def step(self, turn: str) -> Observation:
        calls = parse_tool_calls(turn)
        if not calls:
            return Observation(done=True, reward=self.answer_reward(turn))
        observation = Observation(num_tool_calls=len(calls))
        for call in calls:
            if call.problem is not None:
                content, is_error, seconds = f"error: {call.problem}", True, 0.0
            else:
                result = self.tools.call(call.name, call.arguments)
                content, is_error, seconds = result.content, result.is_error, result.seconds
            observation.messages.append({"role": "tool", "content": content})
            observation.num_tool_errors += int(is_error)
            observation.tool_seconds += seconds
        return observation

    def answer_reward(self, answer: str) -> float:
        """The environment's own reward for the final answer (0 here: the reward source scores it)."""
        return 0.0
