"""prepare_inputs: the base model and the datasets a pipeline run trains on, as KFP artifacts."""

from kfp import dsl
from kfp.dsl import Dataset, Model, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def prepare_inputs(
    base_model: Output[Model],
    sft_train: Output[Dataset],
    sft_eval: Output[Dataset],
    preference_train: Output[Dataset],
    preference_eval: Output[Dataset],
    prompts: Output[Dataset],
    source: str = "tiny",
    base_model_uri: str = "",
):
    """Provide the base model and the datasets of a run.

    Args:
        base_model: The HF model directory training starts from.
        sft_train: SFT rows (messages, or prompt/completion) as JSONL.
        sft_eval: Held-out SFT rows.
        preference_train: Preference rows (prompt, chosen, rejected).
        preference_eval: Held-out preference rows.
        prompts: Prompt rows (prompt, optional answer) for PPO/GRPO and evaluation.
        source: `tiny` builds the offline tiny model and addition task; otherwise a local or s3://
            folder holding sft_train.jsonl, sft_eval.jsonl, pref_train.jsonl, pref_eval.jsonl and
            prompts.jsonl.
        base_model_uri: HF model directory (local or s3://) when `source` is not `tiny`.
    """
    from components.prepare.inputs import provide_inputs

    provide_inputs(source, base_model_uri, base_model.path,
                   {"sft_train": sft_train.path, "sft_eval": sft_eval.path, "pref_train": preference_train.path,
                    "pref_eval": preference_eval.path, "prompts": prompts.path})
