"""train_orpo: ORPO (supervised NLL plus an odds-ratio preference term, no reference model) as a training job."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("orpo")
def train_orpo(
    base_model: Input[Model], train_dataset: Input[Dataset], eval_dataset: Input[Dataset],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    lr: float = 1e-6, max_epochs: int = 1, micro_batch_size: int = 4, max_length: int = 1024, beta: float = 0.1,
    settings: dict = {},
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Align a model to preference pairs with ORPO: the chosen answer's NLL plus an odds-ratio term, no reference.

    Args:
        base_model: The HF model to start from.
        train_dataset: Preference rows (prompt, chosen, rejected) as JSONL.
        eval_dataset: Held-out preference rows.
        model: The aligned HF model.
    """
    from components.stage_io import run_training_component

    run_training_component("orpo", locals())
