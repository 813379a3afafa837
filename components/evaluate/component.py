"""evaluate_model: checkable reward (and reward-model score) of a model against a baseline, in its own job."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def evaluate_model(
    model: Input[Model],
    baseline: Input[Model],
    prompts: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[Markdown],
    run_id: str,
    reward_model: Input[Model] = None,
    reward_function: str = "",
    max_new_tokens: int = 256,
    launcher_mode: str = "kubernetes",
    trainer_image: str = "",
    num_nodes: int = 1,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    job_root: str = "",
) -> float:
    """Score greedy responses of a model and of a baseline on held-out prompts, in a job on a GPU node.

    The component launches `python -m trainer evaluate` as a PyTorchJob (like the training
    stages), so generation runs where the GPUs are; this pod only waits and publishes.

    Args:
        model: The candidate HF model.
        baseline: The HF model to beat (e.g. the SFT model).
        prompts: Held-out prompt rows with answers.
        metrics: `reward` and `baseline_reward` (mean checkable reward from the reward function),
            `improvement`, and with a reward model `rm_score` and `baseline_rm_score`.
        report: A Markdown comparison with sample answers side by side.
        run_id: The pipeline run id (names the job).
        reward_model: Optional reward model whose mean score is reported too.
        reward_function: Registered reward function name, called as f(prompt, completion, answer) -> float.
        max_new_tokens: Longest response in tokens.
        launcher_mode: `kubernetes` runs a PyTorchJob; `local` runs its replicas as local processes.
        trainer_image: Image of the PyTorchJob; empty uses the platform's trainer image.
        num_nodes: Nodes (Master plus Workers).
        gpus_per_node: GPUs per node (one process each; 0 runs one CPU process).
        s3_secret: Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
        job_root: Where the job writes its results; empty uses a folder beside the metrics.

    Returns:
        The candidate's mean checkable reward minus the baseline's (positive when it is better).
    """
    from components.evaluate.job import run_evaluation_component

    return run_evaluation_component(locals())
