"""`get_trainer_wrapper`: the training backend of the experience-driven `Trainer` for a config.

It sits above the interface (`trainer.asynchronous.engine_wrapper`) and its implementation
(`trainer.asynchronous.verl.verl_trainer`), which imports only the interface. Trinity-RFT users
import it from `trainer.asynchronous.engine`, where the seed defines it.
"""

from __future__ import annotations

from trainer.asynchronous.engine_wrapper import TrainEngineWrapper
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.config import GRPOConfig, PPOConfig, StageConfig
from trainer.errors import ConfigError


def get_trainer_wrapper(config: StageConfig, synchronizer: Synchronizer | None = None) -> TrainEngineWrapper:
    """The engine for a config: the native torch engine for PPO and GRPO.

    Args:
        config: The stage config.
        synchronizer: The in-process synchronizer the engine publishes weights to, if any.

    Returns:
        The engine (not yet prepared).

    Raises:
        ConfigError: The stage has no experience-driven engine.
    """
    if isinstance(config, (PPOConfig, GRPOConfig)):
        from trainer.asynchronous.verl.verl_trainer import TorchTrainEngine  # the models, optimizers, FSDP

        return TorchTrainEngine(config, synchronizer)
    raise ConfigError(f"no experience-driven engine for {type(config).__name__}; it supports ppo and grpo")
