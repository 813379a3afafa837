"""Typed stage configs: the shared sections, one config per stage, and loading them from YAML.

`sections.py` holds what every stage shares, `stages.py` the per-stage configs (their algorithm
sections in `preference.py` and `online_algorithms.py`), `loading.py` the YAML reader with
`path:line` errors. Import names from here: this is the package's public surface.
"""

from trainer.config.environment import EnvironmentConfig  # noqa: F401
from trainer.config.loading import (  # noqa: F401
    as_dict,
    build_config,
    describe_fields,
    dump_config,
    load_config,
)
from trainer.config.sections import (  # noqa: F401
    CheckpointConfig,
    ColossalAIConfig,
    DataConfig,
    LoraConfig,
    ModelConfig,
    OnlineCheckpointConfig,
    OnlineTrainConfig,
    OptimizerConfig,
    ParallelConfig,
    RunLoopConfig,
    Section,
    TrackingConfig,
    TrainConfig,
)
from trainer.config.stages import (  # noqa: F401
    COMMAND_CONFIGS,
    STAGE_CONFIGS,
    AsynchronousConfig,
    DPOAlgorithmConfig,
    DPOConfig,
    EvaluateConfig,
    EvaluationRewardConfig,
    GateConfig,
    GenerationConfig,
    GRPOAlgorithmConfig,
    GRPOConfig,
    KTOAlgorithmConfig,
    KTOConfig,
    OnlineAlgorithmConfig,
    OnlineStageConfig,
    ORPOAlgorithmConfig,
    ORPOConfig,
    PPOAlgorithmConfig,
    PPOConfig,
    RewardAlgorithmConfig,
    RewardConfig,
    RewardSourceConfig,
    RolloutConfig,
    SFTAlgorithmConfig,
    SFTConfig,
    StageConfig,
    SupervisedStageConfig,
    VLLMConfig,
)
