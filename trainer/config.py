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

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer.errors import ConfigError, StorageError


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    micro_batch_size: int = Field(8, gt=0, description="Samples (or pairs, or sequences) per rank per forward pass.")
    seed: int = Field(42, description="Seeds model init, data order and sampling; the same seed repeats a run.")
    mixed_precision: Literal["auto", "bf16", "no"] = Field(
        "auto", description="bf16 autocast; `auto` uses it on CUDA devices that support it and fp32 elsewhere."
    )
    log_interval: int = Field(10, gt=0, description="Log metrics every this many optimizer steps.")


class TrainConfig(RunLoopConfig):
    max_epochs: int = Field(1, gt=0, description="Passes over the training data.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps; null runs all epochs.")
    gradient_accumulation_steps: int = Field(1, gt=0, description="Micro-batches per optimizer step.")


class OnlineTrainConfig(RunLoopConfig):
    """The loop of an online stage: its length is `<stage>.num_episodes`; a minibatch is split into
    micro-batches of `micro_batch_size` sequences whose gradients add up to one optimizer step."""


class CheckpointConfig(Section):
    save_interval: int = Field(0, ge=0, description="Save every this many optimizer steps; 0 saves at epoch ends only.")
    resume: bool = Field(True, description="Resume from the latest complete checkpoint in `output_dir` if there is one.")
    keep_last: int = Field(2, ge=0, description="Checkpoints to keep; older ones are deleted after a newer one is complete. 0 keeps all.")


class OnlineCheckpointConfig(CheckpointConfig):
    save_interval: int = Field(0, ge=0, description="Save every this many episodes; 0 saves at the end only.")


class ParallelConfig(Section):
    plugin: Literal["auto", "single", "ddp", "fsdp2", "colossalai"] = Field(
        "auto", description="Booster plugin: `auto` is ddp under torchrun with more than one process, else single."
    )


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


class SFTOptions(Section):
    packing: bool = Field(
        True, description="Concatenate each micro-batch into one padding-free row; samples never attend to each other."
    )


class SFTConfig(SupervisedStageConfig):
    sft: SFTOptions = Field(default_factory=SFTOptions, description="Supervised fine-tuning options.")


class RewardOptions(Section):
    use_margin: bool = Field(
        True, description="Subtract a row's `margin` field inside the Bradley-Terry loss when the data has one."
    )


class RewardConfig(SupervisedStageConfig):
    rm: RewardOptions = Field(default_factory=RewardOptions, description="Reward model options.")


class DPOOptions(Section):
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference (beta in the DPO paper). > 0.")
    loss_type: Literal["sigmoid", "ipo", "simpo"] = Field(
        "sigmoid", description="`sigmoid` (DPO), `ipo` (squared loss), `simpo` (length-normalised, reference-free)."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed fraction of flipped labels (conservative DPO); sigmoid loss only."
    )
    simpo_gamma: float = Field(0.5, ge=0, description="Target reward margin of SimPO (gamma / beta in the paper).")
    reference_free: bool = Field(False, description="Use a uniform reference (log-prob 0) instead of a reference model.")
    precompute_ref_log_probs: bool = Field(
        False, description="Compute reference log-probs once before training and free the reference model."
    )
    ref_model_path: str | None = Field(None, description="Reference model directory; null uses `model.path`.")

    @model_validator(mode="after")
    def _check_combinations(self) -> DPOOptions:
        if self.label_smoothing > 0 and self.loss_type != "sigmoid":
            raise ValueError(
                f"label_smoothing is {self.label_smoothing} but loss_type is {self.loss_type!r}; "
                "label smoothing applies to the sigmoid loss only"
            )
        return self


class DPOConfig(SupervisedStageConfig):
    dpo: DPOOptions = Field(default_factory=DPOOptions, description="DPO loss options.")


# ---------------------------------------------------------------------------------------------
# Online stages (PPO, GRPO). `data.train_path` holds prompt rows; `optimizer.max_grad_norm` clips
# actor and critic alike.


class GenerationOptions(Section):
    max_new_tokens: int = Field(32, gt=0, description="Longest response in tokens.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy decoding.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1 disables it.")
    top_k: int = Field(0, ge=0, description="Sample among the k likeliest tokens; 0 disables it.")
    stop: list[str] = Field(default_factory=list, description="Extra stop tokens (each one token); EOS always stops.")


class RewardSourceConfig(Section):
    model_path: str | None = Field(None, description="Reward model directory (the `rm` stage's `<output_dir>/model`).")
    function: str | None = Field(
        None, description="Reward function as `module:function`, called as f(prompt, completion, answer) -> float."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> RewardSourceConfig:
        if (self.model_path is None) == (self.function is None):
            raise ValueError(f"set exactly one of model_path ({self.model_path!r}) and function ({self.function!r})")
        return self


class OnlineOptions(Section):
    num_episodes: int = Field(10, gt=0, description="Collect-then-learn rounds.")
    num_collect_steps: int = Field(1, gt=0, description="Prompt batches collected per episode.")
    rollout_batch_size: int = Field(16, gt=0, description="Prompts per rank per collect step.")
    num_update_epochs: int = Field(1, gt=0, description="Passes over an episode's experience (PPO epochs).")
    mini_batch_size: int = Field(16, gt=0, description="Sequences per rank per optimizer step.")


class PPOOptions(OnlineOptions):
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
    def _check_ptx(self) -> PPOOptions:
        if self.ptx_coef > 0 and self.ptx_data_path is None:
            raise ValueError(f"ptx_coef is {self.ptx_coef} but ptx_data_path is not set")
        return self


class GRPOOptions(OnlineOptions):
    num_generations: int = Field(4, ge=2, description="Responses sampled per prompt (the group size).")
    beta: float = Field(0.04, ge=0, description="Weight of the k3 KL to the reference inside the loss.")
    epsilon: float = Field(0.2, gt=0, description="Policy ratio clip epsilon.")
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token", description="Average over all response tokens, or per response then over responses."
    )
    scale_rewards: bool = Field(True, description="Divide group-centred rewards by the group std.")


class AsyncOptions(Section):
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


class OnlineStageConfig(StageConfig):
    train: OnlineTrainConfig = Field(default_factory=OnlineTrainConfig, description="Batch size, seed and precision.")
    checkpoint: OnlineCheckpointConfig = Field(default_factory=OnlineCheckpointConfig,
                                               description="Saving (per episode) and resuming.")
    generation: GenerationOptions = Field(default_factory=GenerationOptions, description="Sampling of responses.")
    reward: RewardSourceConfig = Field(description="Where sequence scores come from.")
    asynchronous: AsyncOptions = Field(default_factory=AsyncOptions,
                                       description="The experience-driven Trainer and explorer (modes train/explore/both).")


    @property
    def algorithm(self) -> OnlineOptions:
        """The stage's own section (`ppo` or `grpo`)."""
        raise NotImplementedError

    @property
    def num_generations(self) -> int:
        """Responses sampled per prompt: GRPO's group size, 1 for PPO."""
        return 1


class PPOConfig(OnlineStageConfig):
    ppo: PPOOptions = Field(default_factory=PPOOptions, description="PPO options.")

    @property
    def algorithm(self) -> PPOOptions:
        return self.ppo


class GRPOConfig(OnlineStageConfig):
    grpo: GRPOOptions = Field(default_factory=GRPOOptions, description="GRPO options.")

    @property
    def algorithm(self) -> GRPOOptions:
        return self.grpo

    @property
    def num_generations(self) -> int:
        return self.grpo.num_generations


STAGE_CONFIGS: dict[str, type[StageConfig]] = {
    "sft": SFTConfig, "rm": RewardConfig, "dpo": DPOConfig, "ppo": PPOConfig, "grpo": GRPOConfig,
}


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
    if stage not in STAGE_CONFIGS:
        raise ConfigError(f"unknown stage {stage!r}, expected one of {sorted(STAGE_CONFIGS)}")
    try:
        return STAGE_CONFIGS[stage].model_validate(data)
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
