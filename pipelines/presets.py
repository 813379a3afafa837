"""Presets: named sets of pipeline parameters. `tiny` is the demo on this machine.

The pipelines' own defaults suit a real model on GPUs. A preset replaces them for one run
(`alignflow run rlhf-dpo --preset tiny`, which `make demo` uses): it builds the offline tiny Llama
and the addition task under the run's root and passes their paths as the input URIs, with
hyper-parameters that suit a 2-layer model on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.errors import PipelineError

# Every tiny sample is 4-9 tokens, so grouping by length saves no padding; it would only make each
# batch all one-digit or all two-digit sums, which the 2-layer model learns worse from.
TINY_SUPERVISED = {"train.micro_batch_size": 16, "data.max_length": 32, "optimizer.warmup_steps": 5,
                   "train.group_by_length": False}
TINY_ONLINE = {"train.micro_batch_size": 64, "data.max_length": 32, "optimizer.scheduler": "constant",
               "generation.max_new_tokens": 4, "generation.temperature": 0.7}
TINY_COMMON = {"sft_lr": 3e-3, "sft_epochs": 20, "sft_settings": TINY_SUPERVISED,
               "reward_function": "trainer.tiny.task:reward", "max_new_tokens": 4}

TINY = {
    "rlhf-dpo": {**TINY_COMMON, "dpo_lr": 5e-4, "dpo_epochs": 2, "dpo_beta": 0.1, "dpo_settings": TINY_SUPERVISED},
    "rlhf-ppo": {**TINY_COMMON, "rm_lr": 1e-3, "rm_epochs": 15, "rm_settings": TINY_SUPERVISED,
                 "ppo_lr": 5e-4, "ppo_episodes": 40, "ppo_kl_coef": 0.02,
                 "ppo_settings": {**TINY_ONLINE, "ppo.rollout_batch_size": 256, "ppo.mini_batch_size": 64,
                                  "ppo.critic_lr": 1e-3}},
    "rlhf-grpo": {**TINY_COMMON, "grpo_lr": 5e-4, "grpo_episodes": 40, "grpo_generations": 8,
                  "grpo_settings": {**TINY_ONLINE, "grpo.rollout_batch_size": 32, "grpo.mini_batch_size": 64}},
}
PRESETS = {"tiny": TINY}

# Which input URI parameter each file of the tiny task feeds.
TINY_INPUTS = {"sft_train_uri": "sft_train", "sft_eval_uri": "sft_eval", "preference_train_uri": "pref_train",
               "preference_eval_uri": "pref_eval", "prompts_uri": "prompts", "eval_prompts_uri": "eval_prompts"}


def write_tiny_inputs(root: Path) -> dict[str, str]:
    """Build the tiny model and task under `root/tiny-inputs` (once) and return the input URI parameters."""
    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    directory = root.resolve() / "tiny-inputs"
    if not (directory / "model" / "config.json").is_file():
        write_tiny_model(directory / "model")
    files = write_task(directory / "data")
    return {"base_model_uri": str(directory / "model"),
            **{parameter: str(files[name]) for parameter, name in TINY_INPUTS.items()}}


def preset_arguments(preset: str, pipeline: str, root: Path, accepted: set[str]) -> dict[str, Any]:
    """The parameters a preset sets for `pipeline` (only those the pipeline accepts)."""
    if preset not in PRESETS:
        raise PipelineError(f"--preset {preset!r}: unknown; expected one of {sorted(PRESETS)}")
    arguments = {**write_tiny_inputs(root), **PRESETS[preset].get(pipeline, {})}
    return {name: value for name, value in arguments.items() if name in accepted}
