"""Typed stage configs, loaded from YAML with `--set key=value` overrides.

This file is longer than 300 lines because it holds every stage's config in one place: the
field descriptions are the reference documentation (`--help-config`).

Each stage has one config class built from shared sections. Every field carries exactly one
description (`Field(description=...)`), which `python -m trainer <stage> --help-config` prints.
Unknown keys, wrong types and missing fields fail at load time with one `ConfigError` that names
the dotted key and, when the value came from a file, `path:line`.

Supervised stages (sft, rm, dpo) and online stages (ppo, grpo) share the sections that mean the
same thing in both; each has its own `train` (and online its own `checkpoint`) section, so every
accepted key does something in the stage that accepts it.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from trainer.errors import ConfigError, StorageError


def _admits_bool(annotation: Any) -> bool:
    """Whether a field typed `annotation` may hold True/False (pydantic would read True as 1 for an int)."""
    if annotation is bool or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_admits_bool(arg) for arg in get_args(annotation))
    if origin is Literal:
        return any(isinstance(arg, bool) for arg in get_args(annotation))
    return False


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated, and a
    boolean is never accepted as a number (`micro_batch_size: true` is an error, not 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and not _admits_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError("a number, not a boolean")
        return value


class LoraConfig(Section):
    r: int = Field(8, gt=0, description="LoRA rank of the adapter matrices.")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (alpha / r scales the update).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input, in [0, 1).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Names of the linear modules that receive an adapter.",
    )


class ModelConfig(Section):
    path: str = Field(description="Hugging Face causal LM and tokenizer: a local directory or an s3:// prefix.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    attn_implementation: Literal["sdpa", "eager"] = Field("sdpa", description="Attention kernel of the HF model.")
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter (needs the `lora` extra); null trains all weights.")


class DataConfig(Section):
    train_path: str = Field(
        description="Training data: a .jsonl or .parquet file, or an HF `datasets` directory; local or s3://."
    )
    eval_path: str | None = Field(None, description="Held-out data in the same schema; null skips evaluation.")
    max_length: int = Field(512, gt=0, description="Longest tokenized sample in tokens; longer samples are truncated.")
    skip_bad_rows: bool = Field(
        False, description="Skip and count invalid rows instead of failing on the first one (which names file:line)."
    )


class OptimizerConfig(Section):
    lr: float = Field(1e-5, gt=0, description="Peak learning rate of AdamW.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay of AdamW.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2).")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, ge=0, description="Clip the global gradient norm to this; 0 disables clipping.")
    scheduler: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warmup.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup length in optimizer steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final learning rate as a fraction of `lr`.")


class RunLoopConfig(Section):
    micro_batch_size: int = Field(8, gt=0, description="Samples (or pairs) per rank per forward pass.")
    seed: int = Field(42, description="Seeds model init, data order and sampling; the same seed repeats a run.")
    mixed_precision: Literal["auto", "bf16", "no"] = Field(
        "auto", description="bf16 autocast; `auto` uses it on CUDA devices that support it and fp32 elsewhere."
    )
    log_interval: int = Field(10, gt=0, description="Log metrics every this many optimizer steps.")
    num_threads: int | None = Field(
        None, gt=0, description="torch intra-op threads per process. null (the default) shares the CPUs the process "
        "may use (its CPU affinity, capped by the cgroup quota in /sys/fs/cgroup/cpu.max, i.e. a pod's CPU limit) "
        "equally among the ranks on its node. The value used is logged at start.",
    )


class TrainConfig(RunLoopConfig):
    max_epochs: int = Field(1, gt=0, description="Passes over the training data.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps; null runs all epochs.")
    gradient_accumulation_steps: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    group_by_length: bool = Field(
        True, description="Batch samples of similar length together, which removes most padding: each epoch's "
        "shuffled order is cut into windows of 64 global batches, each window sorted by length and cut into "
        "batches, and the batches shuffled. Every sample is still seen once per epoch, and resuming repeats the "
        "order exactly. false keeps a plain shuffle.",
    )
    max_nonfinite_steps: int = Field(
        10, ge=0, description="Optimizer steps in a row that may be skipped for a non-finite (NaN/inf) loss or "
        "gradient norm before the run fails; each skipped step is counted in `train/nonfinite_skipped`. "
        "A run that ends inside such a streak is not exported.",
    )


class OnlineTrainConfig(RunLoopConfig):
    """The loop of an online stage: its length is `<stage>.num_episodes`."""

    micro_batch_size: int = Field(
        8, gt=0, description="Sequences per rank per forward pass; a minibatch is split into these for one step."
    )
    max_nonfinite_steps: int = Field(
        10, ge=0, description="Optimizer steps in a row (of the actor, or of the critic) that may be skipped for a "
        "non-finite (NaN/inf) loss or gradient norm before the run fails; each skipped step is counted in "
        "`train/nonfinite_skipped` (`critic/nonfinite_skipped`). A run that ends inside such a streak is not exported.",
    )


class CheckpointConfig(Section):
    save_interval: int = Field(0, ge=0, description="Save every this many optimizer steps; 0 saves at epoch ends only.")
    resume: bool = Field(
        True, description="Resume from the latest complete checkpoint in `output_dir` if there is one. With false, "
        "a run into an `output_dir` that has checkpoints refuses to start unless `overwrite` is true."
    )
    overwrite: bool = Field(
        False, description="With `resume: false`: delete the checkpoints, metrics and model a previous run left in "
        "`output_dir` and start over. Needs `resume: false`."
    )
    keep_last: int = Field(2, ge=0, description="Checkpoints to keep; older ones are deleted after a newer one is complete. 0 keeps all.")
    preemption_grace_seconds: float = Field(
        20.0, gt=0, description="After SIGTERM or SIGINT the run finishes its step, writes a blocking checkpoint "
        "and exits with status 128 + signal (143 for SIGTERM); if that takes longer than this many seconds it "
        "exits anyway with the same status and resumes from the previous checkpoint. Keep it below the pod's "
        "terminationGracePeriodSeconds (Kubernetes default 30)."
    )
    lease_timeout_seconds: float = Field(
        60.0, gt=0, description="A run holds `output_dir` with a lease (`lease.json`) it renews every quarter of "
        "this; a second run fails at once while the lease is fresh and takes it over once it is older than this "
        "(at once when the holder is a dead process on the same host)."
    )

    @model_validator(mode="after")
    def _check_overwrite(self) -> CheckpointConfig:
        if self.overwrite and self.resume:
            raise ValueError("overwrite is true but resume is true; set resume: false to start over")
        return self


class OnlineCheckpointConfig(CheckpointConfig):
    save_interval: int = Field(0, ge=0, description="Save every this many episodes; 0 saves at the end only.")


class ColossalAIConfig(Section):
    """ColossalAI's booster plugin (`parallel.plugin: colossalai`; needs the `colossalai` extra, see README)."""

    plugin: Literal["torch_ddp", "low_level_zero", "gemini", "hybrid_parallel"] = Field(
        "torch_ddp", description="ColossalAI plugin: `torch_ddp` (the one that runs on CPU), `low_level_zero` "
        "(ZeRO-1/2), `gemini` (chunked ZeRO-3 with placement), `hybrid_parallel` (tensor parallel + ZeRO). "
        "All but `torch_ddp` need CUDA and cast the model to `train.mixed_precision` themselves.",
    )
    zero_stage: int | None = Field(
        None, ge=0, le=2, description="ZeRO stage: 1 shards optimizer states, 2 also gradients (0: none). Only for "
        "`low_level_zero` (1 or 2) and `hybrid_parallel` (0 to 2); null is 1. Setting it for another plugin is an error.",
    )
    tp_size: int = Field(
        1, gt=0, description="Tensor-parallel degree of `hybrid_parallel` (the number of processes must be a "
        "multiple); those ranks see the same samples. Supervised stages only. Pipeline parallelism is not offered: "
        "its schedule replaces the model call the objectives make.",
    )
    cpu_offload: bool = Field(
        False, description="Keep optimizer states (and fp32 master weights) in CPU memory: `low_level_zero` and "
        "`hybrid_parallel` (ZeRO offload), `gemini` (all optimizer state offloaded).",
    )

    @property
    def resolved_zero_stage(self) -> int:
        return 1 if self.zero_stage is None else self.zero_stage

    @model_validator(mode="after")
    def _check_plugin_knobs(self) -> ColossalAIConfig:
        # A value, not "was it set": a dumped config (config.yaml) must load back as it was.
        if self.zero_stage is not None and self.plugin not in ("low_level_zero", "hybrid_parallel"):
            raise ValueError(f"zero_stage is set but plugin is {self.plugin!r}; it applies to low_level_zero and "
                             "hybrid_parallel")
        if self.plugin == "low_level_zero" and self.zero_stage == 0:
            raise ValueError("zero_stage is 0 but low_level_zero shards: use 1 or 2 (or plugin torch_ddp)")
        if self.tp_size > 1 and self.plugin != "hybrid_parallel":
            raise ValueError(f"tp_size is {self.tp_size} but plugin is {self.plugin!r}; tensor parallelism needs "
                             "hybrid_parallel")
        if self.cpu_offload and self.plugin == "torch_ddp":
            raise ValueError("cpu_offload is true but plugin is 'torch_ddp', which keeps everything on the device")
        return self


class ParallelConfig(Section):
    plugin: Literal["auto", "single", "ddp", "fsdp2", "colossalai"] = Field(
        "auto", description="Booster plugin: `auto` is ddp under torchrun with more than one process, else single; "
        "`colossalai` drives training through ColossalAI's own Booster (options under `parallel.colossalai`)."
    )
    colossalai: ColossalAIConfig | None = Field(
        None, description="ColossalAI's plugin and its knobs; only with plugin colossalai (null: torch_ddp)."
    )

    @field_validator("plugin", mode="after")
    @classmethod
    def _check_torch_for_fsdp2(cls, plugin: str) -> str:
        from trainer.compat import FSDP2_TORCH, missing_requirement

        problem = missing_requirement("torch", FSDP2_TORCH) if plugin == "fsdp2" else None
        if problem:
            raise ValueError(f"another plugin here: fsdp2 {problem}")
        return plugin

    @property
    def colossalai_options(self) -> ColossalAIConfig:
        return self.colossalai or ColossalAIConfig()

    @model_validator(mode="after")
    def _check_colossalai_section(self) -> ParallelConfig:
        # A value, not "was it set": a dumped config (config.yaml) must load back as it was.
        if self.colossalai is not None and self.plugin != "colossalai":
            raise ValueError(f"a colossalai section is given but plugin is {self.plugin!r}; it applies to plugin "
                             "colossalai only")
        return self


class TrackingConfig(Section):
    backend: Literal["mlflow", "none"] = Field(
        "mlflow", description="`mlflow` logs params, metrics and the model (rank 0); `none` keeps only metrics.jsonl."
    )
    experiment_name: str = Field("alignflow", description="MLflow experiment, unless MLFLOW_EXPERIMENT_ID/NAME is set.")
    run_name: str | None = Field(None, description="MLflow run name; null uses the stage name.")
    parent_run_id: str | None = Field(
        None, description="Nest this run under that MLflow run (env ALIGNFLOW_PARENT_RUN_ID when null)."
    )
    pipeline_run_id: str | None = Field(
        None, description="Tag the run with this pipeline run id (env ALIGNFLOW_PIPELINE_RUN_ID when null)."
    )
    system_metrics: bool = Field(False, description="Also log CPU/GPU/memory system metrics.")
    log_model: bool = Field(True, description="Log the final HF model directory as the run's `model` artifact.")
    registered_model_name: str | None = Field(
        None, description="Register the logged model under this name in the MLflow model registry."
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
        from trainer.compat import PACKING_TRANSFORMERS, has_at_least, missing_requirement

        if packing is None:
            return has_at_least("transformers", PACKING_TRANSFORMERS)
        problem = missing_requirement("transformers", PACKING_TRANSFORMERS)
        if packing and problem:
            raise ValueError(f"false or null here: padding-free packing {problem}")
        return packing


class SFTConfig(SupervisedStageConfig):
    sft: SFTAlgorithmConfig = Field(default_factory=SFTAlgorithmConfig, description="Supervised fine-tuning options.")


class RewardAlgorithmConfig(Section):
    use_margin: bool = Field(
        True, description="Subtract a row's `margin` field inside the Bradley-Terry loss when the data has one."
    )


class RewardConfig(SupervisedStageConfig):
    rm: RewardAlgorithmConfig = Field(default_factory=RewardAlgorithmConfig, description="Reward model options.")


class DPOAlgorithmConfig(Section):
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference (beta in the DPO paper). > 0.")
    loss_type: Literal["sigmoid", "ipo", "simpo"] = Field(
        "sigmoid", description="`sigmoid` (DPO), `ipo` (squared loss), `simpo` (length-normalised, reference-free)."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed fraction of flipped labels (conservative DPO); sigmoid loss only."
    )
    simpo_gamma: float = Field(0.5, ge=0, description="Target reward margin of SimPO (gamma / beta in the paper).")
    rpo_alpha: float | None = Field(
        None, ge=0, description="Weight of the chosen response's per-token NLL added to the loss (alpha of DPO+NLL, "
        "Pang et al. 2024; TRL's rpo_alpha; the paper uses 1.0); null adds none. Works with every loss_type."
    )
    reference_free: bool = Field(False, description="Use a uniform reference (log-prob 0) instead of a reference model.")
    precompute_ref_log_probs: bool = Field(
        False, description="Compute reference log-probs once before training and free the reference model."
    )
    ref_model_path: str | None = Field(None, description="Reference model directory; null uses `model.path`.")

    @model_validator(mode="after")
    def _check_combinations(self) -> DPOAlgorithmConfig:
        if self.label_smoothing > 0 and self.loss_type != "sigmoid":
            raise ValueError(
                f"label_smoothing is {self.label_smoothing} but loss_type is {self.loss_type!r}; "
                "label smoothing applies to the sigmoid loss only"
            )
        return self


class DPOConfig(SupervisedStageConfig):
    dpo: DPOAlgorithmConfig = Field(default_factory=DPOAlgorithmConfig, description="DPO loss options.")


# ---------------------------------------------------------------------------------------------
# Online stages (PPO, GRPO). `data.train_path` holds prompt rows; `optimizer.max_grad_norm` clips
# actor and critic alike.


class GenerationConfig(Section):
    max_new_tokens: int = Field(32, gt=0, description="Longest response in tokens.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy decoding.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1 disables it.")
    top_k: int = Field(0, ge=0, description="Sample among the k likeliest tokens; 0 disables it.")
    stop: list[str] = Field(default_factory=list, description="Extra stop tokens (each one token); EOS always stops.")


class RewardSourceConfig(Section):
    model_path: str | None = Field(None, description="Reward model directory (the `rm` stage's `<output_dir>/model`).")
    function: str | None = Field(
        None, description="Reward function by allowed name (built-in `tiny_addition`, or one the platform registers: "
        "`alignflow.rewards` entry points, ALIGNFLOW_REWARD_FUNCTIONS), or `module:function` under a module prefix in "
        "ALIGNFLOW_ALLOWED_REWARD_MODULES; anything else is refused. Called as f(prompt, completion, answer) -> float "
        "(or batched, TRL-style, when the function sets `alignflow_batched`)."
    )
    timeout_seconds: float = Field(
        30.0, gt=0, description="Seconds one reward-function call may take (a batched call: the whole batch); "
        "a call past it fails the run, naming the function and the row."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> RewardSourceConfig:
        if (self.model_path is None) == (self.function is None):
            raise ValueError(f"set exactly one of model_path ({self.model_path!r}) and function ({self.function!r})")
        return self


class OnlineAlgorithmConfig(Section):
    num_episodes: int = Field(10, gt=0, description="Collect-then-learn rounds.")
    num_collect_steps: int = Field(1, gt=0, description="Prompt batches collected per episode.")
    rollout_batch_size: int = Field(16, gt=0, description="Prompts per rank per collect step.")
    num_update_epochs: int = Field(1, gt=0, description="Passes over an episode's experience (PPO epochs).")
    mini_batch_size: int = Field(16, gt=0, description="Sequences per rank per optimizer step.")


class PPOAlgorithmConfig(OnlineAlgorithmConfig):
    kl_coef: float = Field(0.05, ge=0, description="Weight of the per-token KL penalty in the reward (initial value if adaptive).")
    kl_estimator: Literal["k1", "k3"] = Field("k1", description="Per-token KL estimator in the reward.")
    target_kl: float | None = Field(None, gt=0, description="Adapt kl_coef towards this KL per sequence; null keeps it fixed.")
    kl_horizon: int = Field(10000, gt=0, description="Samples over which the adaptive controller corrects.")
    cliprange: float = Field(0.2, gt=0, description="Policy ratio clip epsilon.")
    cliprange_value: float = Field(0.2, gt=0, description="Value clip range around the old values.")
    vf_coef: float = Field(0.5, gt=0, description="Weight of the value loss.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    whiten_advantages: bool = Field(True, description="Normalise advantages over the batch.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    ptx_coef: float = Field(0.0, ge=0, description="Weight of the pretraining (SFT) loss on `ptx_data_path`.")
    ptx_data_path: str | None = Field(None, description="SFT-schema data for the ptx loss.")
    reward_clip: float | None = Field(None, gt=0, description="Clip sequence scores to [-reward_clip, reward_clip].")
    critic_lr: float = Field(1e-5, gt=0, description="Peak learning rate of the critic.")
    critic_model_path: str | None = Field(None, description="Critic init; null uses reward.model_path, else model.path.")

    @model_validator(mode="after")
    def _check_ptx(self) -> PPOAlgorithmConfig:
        if self.ptx_coef > 0 and self.ptx_data_path is None:
            raise ValueError(f"ptx_coef is {self.ptx_coef} but ptx_data_path is not set")
        return self


class GRPOAlgorithmConfig(OnlineAlgorithmConfig):
    num_generations: int = Field(4, ge=2, description="Responses sampled per prompt (the group size).")
    beta: float = Field(0.04, ge=0, description="Weight of the k3 KL to the reference inside the loss.")
    epsilon: float = Field(0.2, gt=0, description="Policy ratio clip epsilon.")
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token", description="Average over all response tokens, or per response then over responses."
    )
    scale_rewards: bool = Field(True, description="Divide group-centred rewards by the group std.")


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
    reward: RewardSourceConfig = Field(description="Where sequence scores come from.")
    asynchronous: AsynchronousConfig = Field(default_factory=AsynchronousConfig,
                                       description="The experience-driven Trainer and explorer (modes train/explore/both).")


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

    @property
    def algorithm(self) -> GRPOAlgorithmConfig:
        return self.grpo

    @property
    def num_generations(self) -> int:
        return self.grpo.num_generations


STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "sft": SFTConfig, "rm": RewardConfig, "dpo": DPOConfig, "ppo": PPOConfig, "grpo": GRPOConfig,
}


# ---------------------------------------------------------------------------------------------
# Evaluation: greedy responses of a candidate and a baseline on held-out prompts, scored.


class EvaluationRewardConfig(Section):
    function: str | None = Field(
        None, description="Reward function by registered name, called as f(prompt, completion, answer) -> float."
    )
    model_path: str | None = Field(None, description="Reward model directory whose mean score is reported too.")

    @model_validator(mode="after")
    def _at_least_one(self) -> EvaluationRewardConfig:
        if self.function is None and self.model_path is None:
            raise ValueError("set function, model_path or both")
        return self


class EvaluateConfig(Section):
    output_dir: str = Field(description="Where final_metrics.json and samples.jsonl go: a local directory or URI.")
    model: ModelConfig = Field(description="The candidate model.")
    baseline_path: str | None = Field(None, description="The model to beat (local or URI); null scores the candidate only.")
    prompts_path: str = Field(description="Held-out prompt rows (`prompt`, `answer`) as JSONL or Parquet; local or URI.")
    reward: EvaluationRewardConfig = Field(description="How responses are scored.")
    generation: GenerationConfig = Field(
        default_factory=lambda: GenerationConfig(temperature=0.0),
        description="Decoding; the default is greedy (temperature 0) so scores are repeatable.",
    )
    batch_size: int = Field(64, gt=0, description="Prompts per generate call.")


# Every config `python -m trainer <command>` reads.
COMMAND_CONFIGS: dict[str, type[Section]] = {**STAGE_CONFIGS, "evaluate": EvaluateConfig}


# ---------------------------------------------------------------------------------------------
# Loading


def _key_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    """Map each dotted key path of a composed YAML document to its 1-based line."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            lines[path] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, path))
    return lines


def _read_yaml(path: str) -> tuple[dict, dict[tuple, int]]:
    """The mapping in a YAML file (a local path, `s3://` or `minio://`) and the line of each key."""
    from trainer.storage import get_storage, is_remote

    try:
        if is_remote(path):
            text = get_storage(path).read_bytes(path).decode()
        else:
            text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: cannot read config: not UTF-8 text ({err.reason})") from err
    except StorageError as err:
        raise ConfigError(f"cannot read config: {err}") from err
    try:
        data = yaml.safe_load(text) or {}
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping of sections at the top, found {type(data).__name__}")
    return data, _key_lines(root) if root is not None else {}


def _apply_override(data: dict, override: str) -> tuple:
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {override!r}: expected key=value, e.g. --set optimizer.lr=1e-4")
    parts = tuple(key.strip().split("."))
    target = data
    for part in parts[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
        target = child
    try:
        target[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from err
    return parts


def _describe(error: dict, path: str | Path | None, lines: dict[tuple, int], overridden: set[tuple]) -> str:
    loc = tuple(str(part) for part in error["loc"])
    dotted = ".".join(loc) or "<top>"
    # Overrides that explain the error: one that set this key, a section around it, or a key inside it.
    flags = sorted(".".join(key) for key in overridden if key[:len(loc)] == loc or loc[:len(key)] == key)
    places = []
    if loc not in overridden:
        # Missing fields have no line of their own: point at the nearest enclosing key.
        line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
        if line is not None or not flags:
            places.append(f"{path}:{line}" if path and line else str(path or "config"))
    places.extend(f"--set {flag}" for flag in flags)
    where = ", ".join(places)
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key {dotted}"
    if kind == "missing":
        return f"{where}: missing required field {dotted}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {dotted} is {error.get('input')!r}, expected: {message}"


def build_config(stage: str, data: dict, *, path: str | Path | None = None, lines: dict | None = None,
                 overridden: set[tuple] = frozenset()) -> StageConfig:
    """Validate a raw mapping into the stage's config class, or raise one ConfigError."""
    if stage not in COMMAND_CONFIGS:
        raise ConfigError(f"unknown stage {stage!r}, expected one of {sorted(COMMAND_CONFIGS)}")
    try:
        return COMMAND_CONFIGS[stage].model_validate(data)
    except ValidationError as err:
        problems = [_describe(e, path, lines or {}, overridden) for e in err.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems)) from None


def load_config(stage: str, path: str | Path, overrides: list[str] = ()) -> StageConfig:
    """Read a stage config from YAML, apply `key=value` overrides, validate.

    Args:
        stage: One of the stages in `STAGE_CONFIGS`.
        path: YAML file with the config sections: a local path, `s3://` or `minio://` URI.
        overrides: `dotted.key=value` strings; values are parsed as YAML scalars.

    Returns:
        The validated config of the stage.

    Raises:
        ConfigError: naming the file:line or `--set` flag and the dotted key at fault.
    """
    path = str(path)  # not Path(): that would fold `s3://b/k` into `s3:/b/k`
    data, lines = _read_yaml(path)
    overridden = {_apply_override(data, item) for item in overrides}
    return build_config(stage, data, path=path, lines=lines, overridden=overridden)


def describe_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """One `dotted.key (type, default): description` line per field, for `--help-config`."""
    out = []
    for name, field in model.model_fields.items():
        # An optional section (`LoraConfig | None`) still documents its fields.
        candidates = [a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None)]
        annotation = candidates[0] if len(candidates) == 1 else field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            out.extend(describe_fields(annotation, f"{prefix}{name}."))
            continue
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        out.append(f"{prefix}{name} ({default}): {field.description}")
    return out


def dump_config(config: StageConfig, path: Path) -> None:
    """Write the resolved config next to the run's outputs, so a run can be repeated."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def as_dict(config: StageConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
