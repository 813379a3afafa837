"""train_grpo: GRPO against a reward function, as a training job (TrainJob or PyTorchJob)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("grpo")
def train_grpo(
    base_model: Input[Model], train_dataset: Input[Dataset], eval_dataset: Input[Dataset],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    reward_function: str, lr: float = 1e-6, num_episodes: int = 10, num_generations: int = 8,
    micro_batch_size: int = 8, max_length: int = 1024, settings: dict = {},
    rollout_engine: str = "hf", environment: str = "",
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Optimise a policy with GRPO: groups of sampled responses, group-normalised advantages, no critic.

    Args:
        base_model: The SFT model: the policy starts here and a frozen copy is the reference.
        train_dataset: Prompt rows (prompt, optional answer) as JSONL.
        eval_dataset: Held-out prompt rows (the mean reward before and after is reported).
        model: The GRPO-trained policy.
    """
    from components.stage_io import run_training_component

    run_training_component("grpo", locals())
