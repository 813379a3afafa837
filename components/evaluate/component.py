"""evaluate_model: checkable reward (and reward-model score) of a model against a baseline."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE)
def evaluate_model(
    model: Input[Model],
    baseline: Input[Model],
    prompts: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[Markdown],
    reward_model: Input[Model] = None,
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 32,
) -> float:
    """Score greedy responses of a model and of a baseline on held-out prompts.

    Args:
        model: The candidate HF model.
        baseline: The HF model to beat (e.g. the SFT model).
        prompts: Prompt rows with answers, as JSONL.
        metrics: `reward` and `baseline_reward` (mean checkable reward from the reward function),
            `improvement`, and with a reward model `rm_score` and `baseline_rm_score`.
        report: A Markdown table of the comparison.
        reward_model: Optional reward model whose mean score is reported too.
        reward_function: `module:function` called as f(prompt, completion, answer) -> float.
        max_new_tokens: Longest response.

    Returns:
        The candidate's mean checkable reward minus the baseline's (positive when it is better).
    """
    from components.evaluate.scoring import score_model

    reward_model_dir = reward_model.path if reward_model is not None else None
    scores = {name: score_model(artifact.path, prompts.path, reward_function, reward_model_dir, max_new_tokens)
              for name, artifact in (("candidate", model), ("baseline", baseline))}
    improvement = scores["candidate"]["reward"] - scores["baseline"]["reward"]
    metrics.log_metric("reward", scores["candidate"]["reward"])
    metrics.log_metric("baseline_reward", scores["baseline"]["reward"])
    metrics.log_metric("improvement", improvement)
    if reward_model_dir:
        metrics.log_metric("rm_score", scores["candidate"]["rm_score"])
        metrics.log_metric("baseline_rm_score", scores["baseline"]["rm_score"])
    columns = ["reward"] + (["rm_score"] if reward_model_dir else [])
    rows = [f"| {name} | " + " | ".join(f"{scores[name][c]:.3f}" for c in columns) + " |"
            for name in ("candidate", "baseline")]
    with open(report.path, "w") as handle:
        handle.write("| model | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
                     + "\n".join(rows) + "\n")
    return improvement
