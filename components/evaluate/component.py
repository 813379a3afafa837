"""evaluate_model: checkable reward (and reward-model score) of a model against a baseline and the registry's
champion, in its own job."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE
from components.parameters import documented


@dsl.component(base_image=LAUNCHER_IMAGE)
@documented()
def evaluate_model(
    model: Input[Model], baseline: Input[Model], prompts: Input[Dataset],
    metrics: Output[Metrics], report: Output[Markdown], run_id: str,
    reward_model: Input[Model] = None, registered_model_name: str = "", parent_run_id: str = "",
    reward_function: str = "", max_new_tokens: int = 256, rollout_engine: str = "hf", environment: str = "",
    gate_confidence: float = 0.95, gate_min_effect: float = 0.05, gate_guard_tolerance: float = 0.05,
    samples_per_prompt: int = 1, temperature: float = 0.0,
    # Where the job runs: the same parameters in every component that launches one (components/parameters.py).
    launcher_mode: str = "kubernetes", trainer_image: str = "", num_nodes: int = 1, gpus_per_node: int = 1,
    s3_secret: str = "", job_root: str = "", scheduling: dict = {},
) -> str:
    """Score responses of a model, a baseline and the current champion on held-out prompts (greedy, or the mean
    of several samples per prompt), in a job on a GPU node, and decide the registration gate.

    The component launches `python -m trainer evaluate` as a training job (like the training
    stages), so generation runs where the GPUs are; this pod resolves the champion, waits, logs the
    metrics to MLflow and publishes. The champion (alias `champion` of `registered_model_name`) is
    scored in the same job on the same prompts, so the gate compares live scores. The gate compares the
    models prompt by prompt: the candidate is registered when the lower confidence bound of its gain
    clears `gate_min_effect` and no guard falls (docs/pipelines.md, "The gate"). Never cache this task:
    the champion changes between runs.

    Args:
        model: The candidate HF model.
        baseline: The HF model to beat (e.g. the SFT model).
        prompts: Held-out prompt rows with answers.
        metrics: `reward` and `baseline_reward` (mean checkable reward from the reward function),
            `improvement`, and with a reward model `rm_score` and `baseline_rm_score`; with a champion
            `champion_reward` (`champion_rm_score`) and `champion_version`; with an `environment`, each model's
            `tool_calls_per_episode` and `valid_tool_call_fraction` (`baseline_...`); the gate's numbers against
            the baseline (`gate/n`, `gate/difference`, `gate/lower_bound`, `gate/min_effect`, `gate/confidence`,
            `gate/opens`, and per guard `gate/guard/<metric>/...`) and against the champion (`champion_gate/...`).
        report: A Markdown comparison: the gate's decisions and their reasons, the means, sample answers side by
            side.
        run_id: The pipeline run id (names the job).
        reward_model: Optional reward model the candidate was trained on: the gate then judges its score, and the
            checkable reward of `reward_function` and the answers' length become guards that must not fall.
        registered_model_name: Registered model whose `champion` version is scored too; empty: none.
        parent_run_id: The pipeline's MLflow parent run; the metrics go to an `evaluate` run nested under
            it (and `evaluation/*` on it), whatever the gate then decides. Empty: not logged to MLflow.
        max_new_tokens: Longest response in tokens.
        rollout_engine: What samples the answers: `hf` (Hugging Face `generate`), `vllm` (each model loaded into
            vLLM's engine; runs the trainer image's vLLM variant) or `auto` (the vLLM variant, which picks `vllm`
            where it pays off: docs/online.md).
        environment: Score multi-turn episodes in this allowed environment (as the agent stage trained them;
            docs/agents.md); empty scores one response per prompt.
        gate_confidence: Confidence of the gate's one-sided lower bounds, in (0.5, 1).
        gate_min_effect: The least gain over the baseline (and the champion) the candidate must show at
            `gate_confidence`, in the judged metric's units (a share of the prompts for a 0/1 reward).
        gate_guard_tolerance: How far a guard (the checkable reward where a reward model is judged; the share of
            agent episodes with only valid tool calls) may fall, at `gate_confidence`, before it refuses.
        samples_per_prompt: Answers sampled per prompt; each prompt's score is their mean (1: one answer).
        temperature: Sampling temperature; 0 is greedy, and then `samples_per_prompt` must be 1.
        job_root: Where the job writes its results; empty uses a folder beside the metrics.

    Returns:
        The gate's decision: `register` when the candidate is confidently better than the baseline, else `refuse`.
    """
    from components.evaluate.job import run_evaluation_component

    return run_evaluation_component(locals())
