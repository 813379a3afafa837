"""train_kto: KTO on unpaired feedback (desirable or undesirable completions) as a training job."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("kto")
def train_kto(
    base_model: Input[Model], train_dataset: Input[Dataset], eval_dataset: Input[Dataset],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    lr: float = 1e-6, max_epochs: int = 1, micro_batch_size: int = 8, max_length: int = 1024, beta: float = 0.1,
    loss_type: str = "kto", desirable_weight: float = 1.0, undesirable_weight: float = 1.0, settings: dict = {},
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Align a model to unpaired feedback with KTO (the base model is also the frozen reference).

    Args:
        base_model: The HF model to start from and to stay near.
        train_dataset: Unpaired rows (prompt, completion, label true/false) as JSONL.
        eval_dataset: Held-out unpaired rows.
        model: The aligned HF model.
    """
    from components.stage_io import run_training_component

    run_training_component("kto", locals())
