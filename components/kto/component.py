"""train_kto: KTO on unpaired feedback (desirable or undesirable completions) as a training job."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def train_kto(
    base_model: Input[Model],
    train_dataset: Input[Dataset],
    eval_dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    curves: Output[HTML],
    run_id: str,
    lr: float = 1e-6,
    max_epochs: int = 1,
    micro_batch_size: int = 8,
    max_length: int = 1024,
    beta: float = 0.1,
    loss_type: str = "kto",
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    settings: dict = {},
    launcher_mode: str = "kubernetes",
    trainer_image: str = "",
    num_nodes: int = 1,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    job_root: str = "",
    parent_run_id: str = "",
    scheduling: dict = {},
):
    """Align a model to unpaired feedback with KTO (the base model is also the frozen reference).

    Args:
        base_model: The HF model to start from and to stay near.
        train_dataset: Unpaired rows (prompt, completion, label true/false) as JSONL.
        eval_dataset: Held-out unpaired rows.
        model: The aligned HF model.
        metrics: Final training and evaluation metrics.
        report: Metrics, curves and the resolved config.
        curves: Loss, reward, KL and learning-rate curves against step, as an HTML plot.
        run_id: The pipeline run id (names the job and keys its checkpoints).
        lr: Peak learning rate of AdamW.
        max_epochs: Passes over the training data.
        micro_batch_size: Samples (or pairs) per rank per forward pass.
        max_length: Longest tokenized sample in tokens; longer samples are truncated.
        beta: Strength of the pull towards the reference (beta in the KTO paper). > 0.
        loss_type: `kto` (against the KL reference point z0) or `apo_zero_unpaired` (no reference point).
        desirable_weight: lambda_D, the weight of a desirable row's loss (KTO eq. 8).
        undesirable_weight: lambda_U, the weight of an undesirable row's loss.
        settings: Any other config fields, as {"dotted.key": value}.
        launcher_mode: `kubernetes` runs a training job (TrainJob or PyTorchJob, the platform's kind); `local` runs
            its nodes as local processes.
        trainer_image: Image of the training job; empty uses the platform's trainer image (one the platform allows).
        num_nodes: Nodes (pods) of the job.
        gpus_per_node: GPUs per node (one process each; 0 runs one CPU process).
        s3_secret: Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
        job_root: Checkpoint and log root of this stage; empty uses a folder beside the model.
        parent_run_id: The pipeline's MLflow run (from open_lineage); this stage's run nests under it.
        scheduling: Overrides of the platform's scheduling defaults for this job's pods, e.g.
            {"cpu_request": "8", "memory_limit": "96Gi", "active_deadline_seconds": 86400,
            "pending_timeout_seconds": 600}; keys are listed in components/launcher/settings/options.py.
    """
    from components.launcher.component_io import run_training_component

    run_training_component("kto", locals())
