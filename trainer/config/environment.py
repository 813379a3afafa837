"""The `environment` section of the online stages and `evaluate`: multi-turn episodes with tools (docs/agents.md)."""

from __future__ import annotations

from pydantic import Field

from trainer.config.sections import Section


class EnvironmentConfig(Section):
    name: str = Field(
        description="The environment each episode runs in, by allowed name: built-ins `tools` (runs the model's tool "
        "calls; a turn without one is the answer) and `tiny_calculator` (the tiny tool-use task), `alignflow."
        "environments` entry points, ALIGNFLOW_ENVIRONMENTS, or `module:Class` under a prefix in "
        "ALIGNFLOW_ALLOWED_ENVIRONMENT_MODULES; anything else is refused before any import.",
    )
    tools: list[str] = Field(
        default_factory=list, description="Tools the episodes may call, by allowed name (built-ins `calculator` and "
        "`python`, the sandboxed code tool; `alignflow.tools` entry points, ALIGNFLOW_TOOLS, or `module:function` "
        "under ALIGNFLOW_ALLOWED_TOOL_MODULES); empty uses the environment's own defaults.",
    )
    max_turns: int = Field(
        4, gt=0, description="Model turns per episode; an episode still going after its last turn is cut and marked "
        "truncated. Each turn is at most `generation.max_new_tokens` tokens.",
    )
    max_total_tokens: int = Field(
        256, gt=0, description="Tokens of an episode after its prompt (model turns and observations together); an "
        "episode that would grow past it is cut and marked truncated.",
    )
    tool_timeout_seconds: float = Field(
        10.0, gt=0, description="Seconds one tool call may run; a call past it becomes an error observation "
        "(`error: <tool>: timed out`).",
    )
    max_tool_output_chars: int = Field(
        2000, gt=0, description="A tool result longer than this is cut to it, followed by a marker saying how many "
        "characters were dropped.",
    )
    max_concurrent_episodes: int = Field(
        8, gt=0, description="Episodes whose environment steps (and tool calls) run at once, on a thread pool.",
    )
