"""register_model: the registration gate. A registry version tagged back to its pipeline run, aliases
`candidate` and `champion`, and a side-by-side report."""

from kfp import dsl
from kfp.dsl import HTML, Input, Metrics, Model, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def register_model(
    model: Input[Model],
    evaluation: Input[Metrics],
    comparison: Output[HTML],
    name: str,
    parent_run_id: str = "",
    run_id: str = "",
    pipeline: str = "",
) -> str:
    """Register the candidate as a new version of `name`; make it the champion when it beats the champion.

    The candidate's directory becomes an MLflow model where it lies (an MLmodel file beside the
    weights, no second copy); the version links to the candidate stage's MLflow run (nested under
    the pipeline's parent run) and is tagged with the KFP run id, the pipeline, the evaluation's
    metrics, the gate's reasons (`alignflow.gate.baseline`, `alignflow.gate.champion`) and the datasets'
    hashes. Alias `candidate` moves to it; `champion` moves to it when evaluate_model, which scored that
    champion in this run, judged the candidate confidently better than it by the gate's rule
    (`champion_gate/opens`), or when there is none.

    Args:
        model: The candidate HF model (its `stage` metadata names the stage run to link).
        evaluation: The evaluation's metrics (reward/baseline_reward, rm_score/baseline_rm_score, `gate/*`, and
            the champion's champion_reward/champion_rm_score, `champion_gate/*` and champion_version when it scored
            one).
        comparison: Side-by-side HTML: candidate vs baseline vs champion, sample answers.
        name: Registered model name.
        parent_run_id: The pipeline's MLflow parent run (from open_lineage).
        run_id: The KFP run id.
        pipeline: The pipeline's name.

    Returns:
        The new model version.
    """
    from components.register.gate import run_gate

    return run_gate(model, evaluation, comparison, name=name, parent_run_id=parent_run_id, kfp_run_id=run_id,
                    pipeline=pipeline)
