"""train_ppo: PPO against a reward model or a reward function, as a training job (TrainJob or PyTorchJob)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented("ppo")
def train_ppo(
    base_model: Input[Model], train_dataset: Input[Dataset], eval_dataset: Input[Dataset], reward_model: Input[Model],
    model: Output[Model], metrics: Output[Metrics], report: Output[Markdown], curves: Output[HTML], run_id: str,
    reward_function: str = "", lr: float = 1e-6, num_episodes: int = 10, micro_batch_size: int = 8,
    max_length: int = 1024, kl_coef: float = 0.05, settings: dict = {},
    rollout_engine: str = "hf", environment: str = "",
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", parent_run_id: str = "", scheduling: dict = {}, task_name: str = "",
):
    """Optimise a policy with PPO (actor, critic on the reward model, frozen reference).

    Args:
        base_model: The SFT model: the actor starts here and a frozen copy is the reference.
        train_dataset: Prompt rows (prompt, optional answer) as JSONL.
        eval_dataset: Held-out prompt rows (the mean reward before and after is reported).
        reward_model: The reward model scoring responses (and the critic's starting point).
        model: The PPO-trained policy.
        reward_function: Registered reward function name to score with instead of the reward model.
    """
    from components.stage_io import run_training_component

    run_training_component("ppo", locals())
