"""The one hook the online stages and the evaluation call: an `AgentRollout` when `environment` is set.

Kept apart from `trainer.agents.rollout` so that importing the online loop imports nothing of the
agents' machinery unless a run asks for an environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.agents.rollout import AgentRollout
    from trainer.config.environment import EnvironmentConfig


def build_agent_rollout(config: EnvironmentConfig | None, tokenizer: Any) -> AgentRollout | None:
    """The multi-turn rollout of `config` (resolved against the allow-list now, so a refused name fails at
    start-up), or None without an `environment` section. Its code tools run in `config.sandbox`, which a
    canary program proves first.

    Raises:
        ConfigError: A tool is refused or needs what is missing, or the sandbox cannot start or hold here.
    """
    if config is None:
        return None
    from trainer.agents.rollout import AgentRollout
    from trainer.agents.tools import bind_code_tools

    rollout = AgentRollout(config, tokenizer)
    rollout.toolbox.tools = bind_code_tools(rollout.toolbox.tools, config.sandbox)
    return rollout
