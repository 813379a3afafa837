"""train_reward_model: a Bradley-Terry reward model as a training job (TrainJob or PyTorchJob)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("rm")
def train_reward_model(
    base_model: Input[Model], train_dataset: Input[Dataset], eval_dataset: Input[Dataset],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    lr: float = 1e-5, max_epochs: int = 1, micro_batch_size: int = 8, max_length: int = 1024, settings: dict = {},
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Train a reward model (backbone plus scalar head) on preference pairs.

    Args:
        base_model: The HF model whose backbone the reward model starts from.
        train_dataset: Preference rows (prompt, chosen, rejected) as JSONL.
        eval_dataset: Held-out preference rows (pair accuracy and margin are reported).
        model: The reward model (HF backbone plus value_head.safetensors).
    """
    from components.stage_io import run_training_component

    run_training_component("rm", locals())
