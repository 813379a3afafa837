"""The pipelines' parameters: those every pipeline takes, declared once, and what the run form says about each.

KFP reads a pipeline's parameters from `inspect.signature` of the pipeline function (its source is not
embedded, unlike a component's) and calls the function once, with a channel per parameter, in the
signature's order. `with_common_parameters` adds `COMMON` to a pipeline's own parameters, so the
parameters every pipeline takes, with the same defaults, are declared here and nowhere else.
`pipeline_parameters`, which every pipeline applies below `@dsl.pipeline`, does that and then `documented`.

KFP takes a pipeline parameter's description from the `Args:` section of the pipeline function's
docstring (kfp's `extract_component_interface`) and writes it into the compiled IR, which the run
form shows. `documented` writes that section, so the pipelines describe a parameter they share in
the same words:

- a stage's own parameter (`dpo_beta`, `ppo_episodes`, `sft_settings`) says what the stage
  component's input says (`train_dpo`'s `beta`, ...: one description, next to the config field it
  sets), after the stage's name;
- the pipelines' other parameters (inputs, cluster, evaluation) are described in `SHARED`.

A parameter with no description is left without one; tests/pipelines/test_pipelines.py names it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from components.parameters import write_args

# What every pipeline takes besides its own parameters, with the same default everywhere (the type is the
# default's). `with_common_parameters` adds them to each pipeline's signature.
COMMON = {
    "dataset_sha256": {},
    "launcher_mode": "kubernetes", "trainer_image": "", "num_nodes": 1, "gpus_per_node": 1, "s3_secret": "",
    "scheduling": {},
    "sft_lr": 2e-5, "sft_epochs": 2, "sft_settings": {},
    "max_new_tokens": 256, "gate_confidence": 0.95, "gate_min_effect": 0.05, "gate_guard_tolerance": 0.05,
    "eval_samples_per_prompt": 1, "eval_temperature": 0.0,
}

SHARED = {
    "environment": "The environment multi-turn episodes run in, by a name the platform allows (built-in `tools`, or "
                   "one registered in policy.environments): the GRPO stage trains on its episodes and the evaluation "
                   "scores them (docs/agents.md).",
    "base_model_uri": "The model to start from: a Hugging Face model folder (config, weights, tokenizer) as an s3:// "
                      "or minio:// URI (a local path with launcher_mode local). Read in place, not copied.",
    "sft_train_uri": "SFT training rows (prompt and completion, or chat messages) as JSONL or Parquet, or a saved HF "
                     "dataset folder, by URI.",
    "sft_eval_uri": "Held-out SFT rows in the same schema, by URI; empty: SFT is not evaluated.",
    "preference_train_uri": "Preference rows (prompt, chosen, rejected) by URI: what DPO or ORPO learns from, or the "
                            "reward model in rlhf-ppo.",
    "preference_eval_uri": "Held-out preference rows, by URI; empty: that stage is not evaluated.",
    "unpaired_train_uri": "Unpaired feedback rows (prompt, completion, and label: true for a desirable completion, "
                          "false for an undesirable one) that KTO learns from, by URI.",
    "unpaired_eval_uri": "Held-out unpaired feedback rows, by URI; empty: KTO is not evaluated.",
    "rollout_engine": "What samples the online stage's answers and the evaluation's: `hf` (Hugging Face generate), "
                      "`vllm` (vLLM's engine; the jobs run the trainer image's vLLM variant) or `auto` (the vLLM "
                      "variant, which picks `vllm` where it pays off: docs/online.md).",
    "prompts_uri": "Prompts (a `prompt` per row) the online stage samples answers to, by URI.",
    "eval_prompts_uri": "Held-out prompts that the candidate, the SFT baseline and the registry's champion answer; "
                        "their scores decide whether the candidate is registered.",
    "reward_function": "A reward function the platform registered (policy.rewardFunctions), by name: scores the "
                       "evaluation's answers as f(prompt, completion, answer) -> float.",
    "dataset_sha256": "Expected SHA-256 of datasets, as {URI: hex}; a dataset that differs stops the run before any "
                      "training. URIs not listed are only hashed and recorded.",
    "launcher_mode": "`kubernetes`: each stage runs as a training job on the cluster (a TrainJob or a PyTorchJob, "
                     "as the platform chose); `local`: as processes in the component's pod.",
    "trainer_image": "Image of the training jobs; empty: the platform's trainer image. Only images the platform "
                     "allows are accepted.",
    "num_nodes": "Nodes (pods) of every training job; more than one trains data-parallel across them.",
    "gpus_per_node": "GPUs each node requests, one training process each; 0 runs one CPU process per node.",
    "s3_secret": "A Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY that the jobs read S3 with; empty: "
                 "the platform's. Only Secrets the platform allows are accepted.",
    "scheduling": "Overrides of the platform's scheduling defaults for every training and evaluation job, as a JSON "
                  "object, e.g. {\"cpu_request\": \"8\", \"memory_limit\": \"96Gi\", \"active_deadline_seconds\": "
                  "86400}; keys: components/launcher/settings/options.py.",
    "max_new_tokens": "Longest answer, in tokens, that the evaluation generates per prompt.",
    "gate_confidence": "Confidence of the gate's lower bounds (0.95: a candidate truly no better than the minimum "
                       "effect still passes one time in twenty). The gate compares candidate and baseline (and "
                       "champion) prompt by prompt on the held-out prompts (docs/pipelines.md, \"The gate\").",
    "gate_min_effect": "The least gain the candidate must show at gate_confidence to be registered (and to become "
                       "champion against the champion), in the judged metric's units: for a 0/1 reward, a share of "
                       "the held-out prompts; the reward model's score where rlhf-ppo trained on one.",
    "gate_guard_tolerance": "How far a guard may fall, at gate_confidence, before it refuses the candidate: the "
                            "checkable reward where a reward model is judged (reward hacking), the share of agent "
                            "episodes whose tool calls were all valid.",
    "eval_samples_per_prompt": "Answers the evaluation samples per held-out prompt; each prompt's score is their "
                               "mean. 1 with eval_temperature 0: one greedy answer. Several (16) at a low "
                               "temperature (0.3) measure each model's chance of a right answer, which lets the gate "
                               "confirm a gain on fewer prompts (docs/pipelines.md, \"The gate\").",
    "eval_temperature": "Sampling temperature of the evaluation's answers; 0 is greedy (then eval_samples_per_prompt "
                        "must be 1).",
    "registered_model_name": "MLflow registered model the candidate becomes a new version of when the gate opens "
                             "(it beat the SFT baseline with confidence); its `champion` is scored beside it.",
}
STAGES = {"sft": ("SFT", "components.sft.component", "train_sft"),
          "rm": ("Reward model", "components.rm.component", "train_reward_model"),
          "dpo": ("DPO", "components.dpo.component", "train_dpo"),
          "kto": ("KTO", "components.kto.component", "train_kto"),
          "orpo": ("ORPO", "components.orpo.component", "train_orpo"),
          "ppo": ("PPO", "components.ppo.component", "train_ppo"),
          "grpo": ("GRPO", "components.grpo.component", "train_grpo")}
# A pipeline's stage parameter suffix -> the stage component's input, where the names differ.
STAGE_INPUTS = {"epochs": "max_epochs", "episodes": "num_episodes", "generations": "num_generations"}


def describe(parameter: str) -> str | None:
    """The description of a pipeline parameter, or None when nothing describes it."""
    if parameter in SHARED:
        return SHARED[parameter]
    stage, _, rest = parameter.partition("_")
    if stage not in STAGES or not rest:
        return None
    import importlib

    title, module, component = STAGES[stage]
    inputs = getattr(importlib.import_module(module), component).component_spec.inputs
    spec = inputs.get(STAGE_INPUTS.get(rest, rest))
    return f"{title}: {spec.description}" if spec is not None and spec.description else None


def documented(pipeline: Callable) -> Callable:
    """`pipeline` with an `Args:` section describing each of its parameters (apply below `@dsl.pipeline`)."""
    pipeline.__doc__ = pipeline.__doc__ or f"The {pipeline.__name__} pipeline."
    return write_args(pipeline, describe)


def with_common_parameters(pipeline: Callable) -> Callable:
    """A pipeline function declared with its own parameters and `*, run: dict`, as KFP sees it: its own
    parameters, then COMMON's.

    KFP calls it with every parameter; the function gets its own by name, and all of them, COMMON's too, as
    `run` (a dict by parameter name, which the frame in steps.py reads). A signature built from a table is
    what lets COMMON be declared once: the alternative, every pipeline listing the same sixteen parameters
    and defaults, is what this replaces.
    """
    own = [parameter for name, parameter in inspect.signature(pipeline).parameters.items() if name != "run"]
    common = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                annotation=type(default)) for name, default in COMMON.items()]
    signature = inspect.Signature(own + common)

    @functools.wraps(pipeline)
    def with_common(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return pipeline(**{parameter.name: bound.arguments[parameter.name] for parameter in own},
                        run=dict(bound.arguments))

    with_common.__signature__ = signature  # what inspect.signature, and so KFP, reads
    return with_common


def pipeline_parameters(pipeline: Callable) -> Callable:
    """`pipeline` taking `COMMON` too (`with_common_parameters`), every parameter described (`documented`)."""
    return documented(with_common_parameters(pipeline))
