"""The `environment` section of the online stages and `evaluate`: multi-turn episodes with tools (docs/agents.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from trainer.config.sandbox import SandboxConfig, SandboxLimits
from trainer.config.sections import Section

# The code tool's limits unless `environment.sandbox.limits` says otherwise: a short calculation per call.
TOOL_SANDBOX_LIMITS = SandboxLimits(wall_seconds=10.0, cpu_seconds=5, memory_bytes=512 << 20, max_processes=16,
                                    max_output_bytes=64 << 10)


def default_tool_sandbox() -> SandboxConfig:
    """The local sandbox with `TOOL_SANDBOX_LIMITS`."""
    return SandboxConfig(limits=TOOL_SANDBOX_LIMITS)


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
    sandbox: SandboxConfig = Field(
        default_factory=default_tool_sandbox, description="Where the tools that run code (the built-in `python`) "
        "run it, and with which limits: `backend` `local` (this pod; Linux 6.12+) or `remote` (the chart's sandbox "
        "service at `url`, its token in the variable `token_env`). A limit left out is the tool's default: 10 s "
        "wall, 5 s CPU, 512 MiB, 16 processes, 64 KiB of output. The sandbox is proved with a canary program when "
        "the environment is built, so a run whose tools cannot run code stops there (docs/sandbox.md).",
    )
    max_concurrent_episodes: int = Field(
        8, gt=0, description="Episodes whose environment steps (and tool calls) run at once, on a thread pool (fewer "
        "where the environment sets its own `max_concurrent_steps`).",
    )
    schedule: Literal["lockstep", "as_ready"] = Field(
        "lockstep", description="When episodes take their turns. `lockstep`: all running episodes are sampled in one "
        "generate call per turn and the next turn waits for every environment's answer; the same rows and seed give "
        "the same episodes, so a resumed run is bit-identical. `as_ready`: an episode's next turn is sampled as soon "
        "as its environment has answered, with whichever episodes are ready then, while the other tools run; faster "
        "when tool latency or episode lengths vary, but with temperature sampling the episodes depend on timing "
        "(greedy decoding with deterministic environments gives lockstep's episodes).",
    )

    oversample_groups: int = Field(
        0, ge=0, description="Prompts sampled per rollout beyond `rollout_batch_size`, each a group of "
        "`num_generations` episodes (`as_ready` only). The rollout returns as soon as `rollout_batch_size` groups "
        "have every episode ended and trains on those; the other episodes are abandoned and their prompts count as "
        "consumed (not retried, also after a resume). The asynchronous explorer carries them on to its next batch "
        "instead, under the next weights, within `asynchronous.max_staleness`. 0 waits for every episode. "
        "Evaluation runs every episode.",
    )

    @field_validator("oversample_groups")
    @classmethod
    def _oversample_as_ready(cls, value: int, info: ValidationInfo) -> int:
        """Over-sampling drops a long tail, which only `as_ready` has (a lockstep turn waits for every episode)."""
        schedule = info.data.get("schedule", "as_ready")  # absent: its own error is reported
        if value and schedule != "as_ready":
            raise ValueError(f"0 under schedule {schedule!r}; over-sampling needs environment.schedule: as_ready, "
                             "since a lockstep turn waits for every episode anyway")
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _tool_limits_by_default(cls, value: Any) -> Any:
        """Limits a `sandbox` mapping leaves out are the tool's (`TOOL_SANDBOX_LIMITS`), not a reward's."""
        if isinstance(value, dict) and isinstance(value.get("limits", {}), dict):
            return {**value, "limits": {**TOOL_SANDBOX_LIMITS.model_dump(), **value.get("limits", {})}}
        return value
