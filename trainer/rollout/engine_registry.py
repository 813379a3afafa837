"""`build_rollout_engine`: the rollout engine a stage's `rollout.engine` names.

It sits above the interface (`trainer.rollout.engines`) and the engines, which import only the
interface: `hf` (`engines.HFGenerateEngine`) and `vllm` (`trainer.rollout.vllm_engine`, imported only
when a config asks for it, so nothing else needs vLLM installed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from torch import nn

from trainer.config import RolloutConfig
from trainer.errors import ConfigError
from trainer.rollout.engines import EngineSetup, HFGenerateEngine, RolloutEngine

logger = logging.getLogger(__name__)


def build_vllm_engine(policy: nn.Module | None, config: RolloutConfig, setup: EngineSetup | None) -> RolloutEngine:
    """vLLM's offline engine on its own copy of the weights, started from `setup.model_path`."""
    from trainer.rollout.vllm_engine import VLLMEngine  # imports vLLM: only when asked for

    if setup is None:
        raise ValueError("the vllm engine needs an EngineSetup (where its weights start)")
    return VLLMEngine(config, setup)  # sync_from is handed the policy


ROLLOUT_ENGINES: dict[str, Callable[[nn.Module | None, RolloutConfig, EngineSetup | None], RolloutEngine]] = {
    "hf": lambda policy, config, setup: HFGenerateEngine(policy, config.num_threads),
    "vllm": build_vllm_engine,
}


def build_rollout_engine(config: RolloutConfig, policy: nn.Module | None,
                         setup: EngineSetup | None = None) -> RolloutEngine:
    """The engine `rollout.engine` names, set up to sample with `policy`'s weights.

    Args:
        config: The `rollout` section.
        policy: The model whose weights are sampled (`hf` samples with it; `vllm` starts from
            `setup.model_path` and takes this model's weights at `sync_from`); None only where the
            engine is built from `setup` alone (evaluation of a saved model with `vllm`).
        setup: Where an engine with its own weights starts (`engines.engine_setup` for a stage).

    Returns:
        The engine.

    Raises:
        ConfigError: `rollout.engine` names no registered engine.
    """
    if config.engine not in ROLLOUT_ENGINES:  # the config's choices and this table are kept in step
        raise ConfigError(f"rollout.engine: unknown engine {config.engine!r}; expected one of "
                          f"{', '.join(sorted(ROLLOUT_ENGINES))}")
    logger.info("rollout engine %s, CPU sampling threads: %s (rollout.num_threads; OMP_WAIT_POLICY %s)",
                config.engine, config.num_threads, os.environ.get("OMP_WAIT_POLICY", "unset"))
    return ROLLOUT_ENGINES[config.engine](policy, config, setup)
