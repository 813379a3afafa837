"""The config sections every stage shares: model, data, optimizer, loop, checkpoints, parallelism, tracking.

Every field carries exactly one description (`Field(description=...)`), which
`python -m trainer <stage> --help-config` prints; unknown keys are errors.
"""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from trainer.storage.base import SUPPORTED_LOCATIONS, unsupported_scheme


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


def _names_a_location(field_name: str) -> bool:
    """Whether a field holds a path or storage URI: `path`, `*_path` and `*_dir` fields, by the config's naming rule."""
    return field_name == "path" or field_name.endswith(("_path", "_dir"))


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated, a
    boolean is never accepted as a number (`micro_batch_size: true` is an error, not 1), and a
    location (`path`, `*_path`, `*_dir`) with a scheme no storage serves (`gs://`) is refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and not _admits_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError("a number, not a boolean")
        return value

    @field_validator("*")
    @classmethod
    def _known_storage_scheme(cls, value: Any, info: ValidationInfo) -> Any:
        # Otherwise `gs://b/x.jsonl` would be read as a relative local path and reported as missing.
        if isinstance(value, str) and _names_a_location(info.field_name):
            scheme = unsupported_scheme(value)
            if scheme:
                raise ValueError(f"{SUPPORTED_LOCATIONS}; {scheme} is not supported")
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
    lean_activations: bool = Field(
        True, description="Llama-family SwiGLU MLPs and RMSNorms keep fewer tensors for backward and recompute the "
        "elementwise rest (forward unchanged, gradients equal up to rounding); false keeps Hugging Face's modules."
    )
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
    """ColossalAI's booster plugin (`parallel.plugin: colossalai`; needs the `colossalai` extra, see docs/models.md)."""

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


def resolve_packing(packing: bool | None) -> bool:
    """A `packing` option: null packs where the installed transformers can; true where it cannot is an error."""
    from trainer.compat import PACKING_TRANSFORMERS, has_at_least, missing_requirement

    if packing is None:
        return has_at_least("transformers", PACKING_TRANSFORMERS)
    problem = missing_requirement("transformers", PACKING_TRANSFORMERS)
    if packing and problem:
        raise ValueError(f"false or null here: padding-free packing {problem}")
    return packing
