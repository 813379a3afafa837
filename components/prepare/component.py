"""prepare_inputs: the datasets a pipeline run trains on, copied into the run as KFP artifacts."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def prepare_inputs(
    sft_train: Output[Dataset],
    sft_eval: Output[Dataset],
    preference_train: Output[Dataset],
    preference_eval: Output[Dataset],
    unpaired_train: Output[Dataset],
    unpaired_eval: Output[Dataset],
    prompts: Output[Dataset],
    eval_prompts: Output[Dataset],
    sft_train_uri: str = "",
    sft_eval_uri: str = "",
    preference_train_uri: str = "",
    preference_eval_uri: str = "",
    unpaired_train_uri: str = "",
    unpaired_eval_uri: str = "",
    prompts_uri: str = "",
    eval_prompts_uri: str = "",
    content_fingerprint: str = "",
):
    """Copy the run's datasets (JSONL or Parquet files, local, s3:// or minio://) into its artifacts.

    The copies pin what the run trained on: a later change at the same URI does not change this
    run. The task is cached on `content_fingerprint` (the inputs' ETags), so an unchanged dataset
    is not copied again, and a changed one is, even at the same URI.

    Args:
        sft_train: SFT rows (messages, or prompt/completion).
        sft_eval: Held-out SFT rows.
        preference_train: Preference rows (prompt, chosen, rejected).
        preference_eval: Held-out preference rows.
        unpaired_train: Unpaired feedback rows (prompt, completion, label) that KTO trains on.
        unpaired_eval: Held-out unpaired feedback rows.
        prompts: Prompt rows (prompt, optional answer) that PPO/GRPO train on.
        eval_prompts: Held-out prompt rows with answers, for evaluation.
        sft_train_uri: Where the SFT training rows are; empty when the pipeline does not use them.
        sft_eval_uri: Where the held-out SFT rows are.
        preference_train_uri: Where the preference training rows are.
        preference_eval_uri: Where the held-out preference rows are.
        unpaired_train_uri: Where the unpaired feedback rows are.
        unpaired_eval_uri: Where the held-out unpaired feedback rows are.
        prompts_uri: Where the training prompts are.
        eval_prompts_uri: Where the held-out prompts are.
        content_fingerprint: A hash of the inputs' content (from `fingerprint_inputs`); it is what
            the cache keys on.
    """
    from components.prepare.inputs import copy_datasets

    copy_datasets({sft_train.path: sft_train_uri, sft_eval.path: sft_eval_uri,
                   preference_train.path: preference_train_uri, preference_eval.path: preference_eval_uri,
                   unpaired_train.path: unpaired_train_uri, unpaired_eval.path: unpaired_eval_uri,
                   prompts.path: prompts_uri, eval_prompts.path: eval_prompts_uri})
