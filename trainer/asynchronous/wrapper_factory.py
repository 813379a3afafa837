"""`get_trainer_wrapper`: the training backend of the experience-driven `Trainer` for a config.

It sits above the interface (`trainer.asynchronous.engine_wrapper`) and its implementation
(`trainer.asynchronous.verl.verl_trainer`), which imports only the interface. Trinity-RFT users
import it from `trainer.asynchronous.engine`, where the seed defines it.
"""

from __future__ import annotations

from trainer.algorithms.online.registry import online_algorithm
from trainer.asynchronous.engine_wrapper import TrainEngineWrapper
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.config import StageConfig
from trainer.errors import ConfigError


def get_trainer_wrapper(config: StageConfig, synchronizer: Synchronizer | None = None) -> TrainEngineWrapper:
    """The engine for a config: the native torch engine, for every online algorithm (PPO, GRPO).

    Args:
        config: The stage config.
        synchronizer: The in-process synchronizer the engine publishes weights to, if any.

    Returns:
        The engine (not yet prepared).

    Raises:
        ConfigError: The stage has no experience-driven engine.
    """
    try:
        online_algorithm(config)  # before the engine's heavy imports
    except ConfigError as err:
        raise ConfigError(f"no experience-driven engine: {err}") from err
    from trainer.asynchronous.verl.verl_trainer import TorchTrainEngine  # the models, optimizers, FSDP

    return TorchTrainEngine(config, synchronizer)
