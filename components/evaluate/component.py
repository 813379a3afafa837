"""evaluate_model: checkable reward (and reward-model score) of a model against a baseline and the registry's
champion, in its own job."""

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
    registered_model_name: str = "",
    parent_run_id: str = "",
    reward_function: str = "",
    max_new_tokens: int = 256,
    launcher_mode: str = "kubernetes",
    rollout_engine: str = "hf",
    environment: str = "",
    trainer_image: str = "",
    num_nodes: int = 1,
    gpus_per_node: int = 1,
    s3_secret: str = "",
    job_root: str = "",
    scheduling: dict = {},
) -> float:
    """Score greedy responses of a model, a baseline and the current champion on held-out prompts, in a job
    on a GPU node.

    The component launches `python -m trainer evaluate` as a training job (like the training
    stages), so generation runs where the GPUs are; this pod resolves the champion, waits, logs the
    metrics to MLflow and publishes. The champion (alias `champion` of `registered_model_name`) is
    scored in the same job on the same prompts, so the gate compares live scores. Never cache this
    task: the champion changes between runs.

    Args:
        model: The candidate HF model.
        baseline: The HF model to beat (e.g. the SFT model).
        prompts: Held-out prompt rows with answers.
        metrics: `reward` and `baseline_reward` (mean checkable reward from the reward function),
            `improvement`, and with a reward model `rm_score` and `baseline_rm_score`; with a champion
            `champion_reward` (`champion_rm_score`) and `champion_version`; with an `environment`, each model's
            `tool_calls_per_episode` and `valid_tool_call_fraction` (`baseline_...`).
        report: A Markdown comparison with sample answers side by side.
        run_id: The pipeline run id (names the job).
        reward_model: Optional reward model whose mean score is reported too.
        registered_model_name: Registered model whose `champion` version is scored too; empty: none.
        parent_run_id: The pipeline's MLflow parent run; the metrics go to an `evaluate` run nested under
            it (and `evaluation/*` on it), whatever the gate then decides. Empty: not logged to MLflow.
        reward_function: Registered reward function name, called as f(prompt, completion, answer) -> float.
        max_new_tokens: Longest response in tokens.
        launcher_mode: `kubernetes` runs a training job (TrainJob or PyTorchJob, the platform's kind); `local` runs
            its nodes as local processes.
        rollout_engine: What samples the answers: `hf` (Hugging Face `generate`), `vllm` (each model loaded into
            vLLM's engine; runs the trainer image's vLLM variant) or `auto` (the vLLM variant, which picks `vllm`
            where it pays off: docs/online.md).
        environment: Score multi-turn episodes in this allowed environment (as the agent stage trained them;
            docs/agents.md); empty scores one response per prompt.
        trainer_image: Image of the training job; empty uses the platform's trainer image.
        num_nodes: Nodes (pods) of the job.
        gpus_per_node: GPUs per node (one process each; 0 runs one CPU process).
        s3_secret: Name of an existing Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
        job_root: Where the job writes its results; empty uses a folder beside the metrics.
        scheduling: Overrides of the platform's scheduling defaults for the job's pods (the run's
            `scheduling` parameter, as the training stages get it; keys in components/launcher/settings/options.py).

    Returns:
        The candidate's mean checkable reward minus the baseline's (positive when it is better).
    """
    from components.evaluate.job import run_evaluation_component

    return run_evaluation_component(locals())
