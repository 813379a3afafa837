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
    reward_function: str = "trainer.tiny.task:reward",
    max_new_tokens: int = 32,
) -> float:
    """Score greedy responses of a model and of a baseline on held-out prompts.

    Args:
        model: The candidate HF model.
        baseline: The HF model to beat (e.g. the SFT model).
        prompts: Prompt rows with answers, as JSONL.
        metrics: `reward` and `baseline_reward` (mean reward-function score) and their difference.
        report: A Markdown table of the comparison.
        reward_function: `module:function` called as f(prompt, completion, answer) -> float.
        max_new_tokens: Longest response.

    Returns:
        The candidate's mean reward minus the baseline's (positive when the candidate is better).
    """
    from components.evaluate.scoring import mean_reward

    scores = {name: mean_reward(artifact.path, prompts.path, reward_function, max_new_tokens)
              for name, artifact in (("model", model), ("baseline", baseline))}
    improvement = scores["model"] - scores["baseline"]
    metrics.log_metric("reward", scores["model"])
    metrics.log_metric("baseline_reward", scores["baseline"])
    metrics.log_metric("improvement", improvement)
    with open(report.path, "w") as handle:
        handle.write("| model | mean reward |\n|---|---|\n"
                     f"| candidate | {scores['model']:.3f} |\n| baseline | {scores['baseline']:.3f} |\n")
    return improvement
