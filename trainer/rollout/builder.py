"""`build_rollout`: the one function that builds every rollout, and `build_agent`, its environment side.

The colocated loop (`trainer.online.stages`), the asynchronous explorer and the evaluation each call
`build_rollout` once the policy is loaded. It resolves `rollout.engine: auto` (`engine_choice`), builds
the engine (`engine_registry`) and wraps it in a single-turn rollout, or, with an agent, a multi-turn
one. The agent is built earlier, by `build_agent`, before any model loads: a refused environment or
tool fails at start-up, and a code tool's sandbox proves itself with a canary program first.

The multi-turn machinery (`trainer.rollout.multi_turn`, and through it `trainer.agents`) is imported
only when a run asks for an environment.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.config import GenerationConfig, RolloutConfig
from trainer.rollout.engine_choice import choose_engine
from trainer.rollout.engine_registry import build_rollout_engine
from trainer.rollout.engines import EngineSetup
from trainer.rollout.interface import Rollout
from trainer.rollout.scoring import Scorer
from trainer.rollout.single_turn import SingleTurnRollout

if TYPE_CHECKING:
    from trainer.config.environment import EnvironmentConfig
    from trainer.rollout.multi_turn import Agent

logger = logging.getLogger(__name__)


def build_rollout(settings: RolloutConfig, *, policy: nn.Module | None, tokenizer: Any, generation: GenerationConfig,
                  scorer: Scorer, device: torch.device, rows_per_call: int, setup: EngineSetup | None = None,
                  agent: Agent | None = None, label: str = "the policy") -> Rollout:
    """The rollout that samples `policy` as the `rollout` section says, `auto` chosen here.

    Args:
        settings: The `rollout` section.
        policy: The model whose weights are sampled (possibly wrapped or sharded): `hf` samples with it, `auto`
            reads its size. None where the engine loads `setup.model_path` itself (`vllm` named outright). A
            model loaded only to choose (the evaluation's) is freed here when `vllm` wins, before vLLM loads.
        tokenizer: Encodes prompts and decodes responses.
        generation: Sampling settings (the `generation` section).
        scorer: Scores the responses.
        device: Where the trainer runs (and the batch lives).
        rows_per_call: Sequences one `collect` samples on this rank (prompts x samples per prompt), for `auto`.
        setup: Where an engine with its own copy of the weights starts (`engines.engine_setup` for a stage).
        agent: Run an episode per row in its environment (`build_agent`); None samples one response per row.
        label: What `policy` is, in the log line of the `auto` choice.

    Returns:
        A `SingleTurnRollout` or `MultiTurnRollout`; its `settings` name the chosen engine.

    Raises:
        ConfigError: The engine is not a registered one.
    """
    engine_name, reason = choose_engine(settings, policy, rows_per_call, device)
    if settings.engine == "auto":
        logger.info("rollout.engine auto for %s: %s, as %s", label, engine_name, reason)
    settings = settings.model_copy(update={"engine": engine_name})
    if engine_name != "hf":
        policy = None  # the engine keeps its own copy; a model loaded only to choose can go before it loads
    engine = build_rollout_engine(settings, policy, setup)
    parts = {"tokenizer": tokenizer, "generation": generation, "device": device, "scorer": scorer,
             "settings": settings}
    if agent is None:
        return SingleTurnRollout(engine, **parts)
    from trainer.rollout.multi_turn import MultiTurnRollout

    return MultiTurnRollout(engine, agent=agent, **parts)


def build_agent(config: EnvironmentConfig | None, tokenizer: Any) -> Agent | None:
    """The environment side of `config`'s multi-turn rollouts (resolved against the allow-list now, so a refused
    name fails at start-up), or None without an `environment` section. Its code tools run in `config.sandbox`,
    which a canary program proves first.

    Raises:
        ConfigError: A tool is refused or needs what is missing, or the sandbox cannot start or hold here.
    """
    if config is None:
        return None
    from trainer.agents.tools import bind_code_tools
    from trainer.rollout.multi_turn import Agent

    agent = Agent(config, tokenizer)
    agent.toolbox.tools = bind_code_tools(agent.toolbox.tools, config.sandbox)
    return agent
