"""`online_algorithm`: the algorithm object of an online stage config, from one table.

This is the only place that looks at a stage config's class to choose an algorithm
(`tests/trainer/algorithms/online/test_registry.py` holds every other file to that). A third online
algorithm is one `OnlineAlgorithm` subclass and one row here.
"""

from __future__ import annotations

from trainer.algorithms.online.base import OnlineAlgorithm
from trainer.algorithms.online.grpo import GRPOAlgorithm
from trainer.algorithms.online.ppo import PPOAlgorithm
from trainer.config import GRPOConfig, PPOConfig, StageConfig
from trainer.errors import ConfigError

ONLINE_ALGORITHMS: dict[type[StageConfig], type[OnlineAlgorithm]] = {PPOConfig: PPOAlgorithm, GRPOConfig: GRPOAlgorithm}


def online_algorithm(config: StageConfig) -> OnlineAlgorithm:
    """The algorithm that trains `config`'s stage, built from it.

    Raises:
        ConfigError: The stage is not an online one.
    """
    algorithm_class = ONLINE_ALGORITHMS.get(type(config))
    if algorithm_class is None:
        names = " and ".join(algorithm.name for algorithm in ONLINE_ALGORITHMS.values())
        raise ConfigError(f"{type(config).__name__} is not an online stage; online training supports {names}")
    return algorithm_class(config)
