"""train_sft: supervised fine-tuning as a training job (TrainJob or PyTorchJob)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("sft")
def train_sft(
    train_dataset: Input[Dataset], eval_dataset: Input[Dataset],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    base_model_uri: str = "", lr: float = 1e-5, max_epochs: int = 1, micro_batch_size: int = 8,
    max_length: int = 1024, settings: dict = {},
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Fine-tune a causal LM on chat or prompt/completion data (loss on completions only).

    Args:
        train_dataset: SFT rows as JSONL.
        eval_dataset: Held-out SFT rows.
        model: The fine-tuned HF model.
        base_model_uri: The HF model to start from (local, s3:// or minio://), read in place by the job.
    """
    from components.stage_io import run_training_component

    run_training_component("sft", locals())
