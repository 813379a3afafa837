"""Presets: named sets of pipeline parameters. `tiny` is the demo on this machine.

The pipelines' own defaults suit a real model on GPUs. A preset replaces them for one run
(`alignflow run rlhf-dpo --preset tiny`, which `make demo` uses): it builds the offline tiny Llama
and the addition task under the run's root and passes their paths as the input URIs, with
hyper-parameters that suit a 2-layer model on a CPU.

`tiny` is tuned so that every addition-task pipeline's candidate beats its SFT baseline on the held-out
prompts (16 sampled answers a prompt, checked by the task) with confidence, so the registration gate
opens on every seed and CPU variant measured (rlhf-agent runs the tiny tool-use task instead, where its gate
opens likewise: see TINY_AGENT_RUN); `tiny-reward-hacking` (rlhf-ppo only) is the same run with
PPO's KL penalty removed and an 8x learning rate, so PPO over-optimises its reward model and the
accuracy guard refuses it; `tiny-vllm` (rlhf-grpo, rlhf-ppo) samples
with vLLM (`rollout_engine: vllm`) on a tiny model vLLM's CPU attention can run. `benchmarks/tiny_preset.py` reproduces
the tuning (every pipeline over several seeds, in-process) and `benchmarks/tiny_preset.md` logs it.
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
# SFT stops while the model writes well-formed sums but gets only about a third of the held-out
# ones right (15 epochs; 20 reach 0.45-0.75 and leave little for any method to add on these 20 prompts).
# The evaluation samples 16 answers per held-out prompt at temperature 0.3 and scores each prompt by their mean:
# on 20 prompts one greedy answer each lets the gate confirm only gains of about +0.30 with no loss, where the
# mean of 16 samples sees every shift of probability toward the right sum (benchmarks/tiny_preset.md).
TINY_EVALUATION = {"eval_samples_per_prompt": 16, "eval_temperature": 0.3}
TINY_COMMON = {"sft_lr": 3e-3, "sft_epochs": 15, "sft_settings": TINY_SUPERVISED,
               "reward_function": "trainer.tiny.task:reward", "max_new_tokens": 4, **TINY_EVALUATION}

# rlhf-agent on the tiny tool-use task (`trainer.tiny.agent_task`: two-digit products with a calculator). Episodes
# are one tool call, its result and the answer (about 100 tokens: the tiny tokenizer spells the call character by
# character). Its SFT traces come from a teacher that mostly writes `36x48` when the first number is even (an
# invalid call, then an answer from memory); SFT copies that habit and GRPO unlearns it, which raises accuracy and
# tool-call validity enough for the gate on every seed and CPU variant measured (benchmarks/tiny_preset.md). The
# evaluation stays greedy (one episode a product): the gain is large enough to confirm on 64 products. 15 SFT
# epochs: at 12 the copying of the operands was still unlearnt at seed 3 (0.06 right), at 10 at seed 42.
TINY_AGENT_RUN = {
    "sft_lr": 3e-3, "sft_epochs": 15, "reward_function": "tiny_calculator", "environment": "tiny_calculator",
    "max_new_tokens": 80,
    "sft_settings": {**TINY_SUPERVISED, "data.max_length": 192, "train.micro_batch_size": 32},
    "grpo_lr": 1e-4, "grpo_episodes": 20, "grpo_generations": 8,
    "grpo_settings": {**TINY_ONLINE, "generation.max_new_tokens": 80, "generation.temperature": 0.5,
                      "grpo.rollout_batch_size": 8, "grpo.mini_batch_size": 64, "environment.max_turns": 3,
                      "environment.max_total_tokens": 200}}

TINY = {
    # DPO+NLL (rpo_alpha 1, as in Pang et al. 2024): plain DPO widens the chosen-rejected margin while
    # the chosen answer's own likelihood falls, and greedy accuracy drops; the NLL term keeps it likely.
    "rlhf-dpo": {**TINY_COMMON, "dpo_lr": 5e-4, "dpo_epochs": 2, "dpo_beta": 0.1,
                 "dpo_settings": {**TINY_SUPERVISED, "dpo.rpo_alpha": 1.0}},
    # The KL penalty is charged per token in reward units, and this reward model's scores spread over
    # about ten points: with a small kl_coef PPO buys reward with answers the SFT model would not write
    # (and the reward model never saw). kl_coef 4 keeps it among answers the SFT model finds likely,
    # where the reward model can be trusted.
    "rlhf-ppo": {**TINY_COMMON, "rm_lr": 1e-3, "rm_epochs": 15, "rm_settings": TINY_SUPERVISED,
                 "ppo_lr": 5e-4, "ppo_episodes": 40, "ppo_kl_coef": 4.0,
                 "ppo_settings": {**TINY_ONLINE, "ppo.rollout_batch_size": 256, "ppo.mini_batch_size": 64,
                                  "ppo.critic_lr": 1e-3}},
    "rlhf-grpo": {**TINY_COMMON, "grpo_lr": 5e-4, "grpo_episodes": 60, "grpo_generations": 8,
                  "grpo_settings": {**TINY_ONLINE, "grpo.rollout_batch_size": 32, "grpo.mini_batch_size": 64}},
    # Half weight on the undesirable rows: at equal weights KTO pushed their answers (among them the empty one)
    # down until, on some seeds, every answer was noise (benchmarks/tiny_preset.md); the KTO paper keeps
    # desirable weight x count at 1 to 4/3 of undesirable's, and this is 2.
    "rlhf-kto": {**TINY_COMMON, "kto_lr": 5e-4, "kto_epochs": 3, "kto_beta": 1.0, "kto_undesirable_weight": 0.5,
                 "kto_settings": TINY_SUPERVISED},
    "rlhf-orpo": {**TINY_COMMON, "orpo_lr": 5e-4, "orpo_epochs": 2, "orpo_beta": 0.1, "orpo_settings": TINY_SUPERVISED},
    "rlhf-agent": TINY_AGENT_RUN,  # on the tool-use task's files, not the addition task's (preset_arguments)
}
# Reward hacking, caught: without the KL penalty and with an 8x learning rate, PPO drifts to answers
# the checker rejects ("=7", "==7", "3" for every "a+0="): their accuracy falls and the gate stays closed on all six
# seeds (docs/pipelines.md). At 4x (2e-3) it did so on the machines of 3 December 2026, but on an AVX-512 one the
# reward model trained differently and seed 42 gained an answer; at 8x it falls on all six seeds on both.
TINY_REWARD_HACKING = {"rlhf-ppo": {**TINY["rlhf-ppo"], "ppo_kl_coef": 0.0, "ppo_lr": 4e-3}}
# `tiny` sampled by vLLM (`rollout.engine: vllm` in the online stage and the evaluation; needs vLLM, e.g. the
# environment of `make test-vllm`). vLLM's CPU attention takes head sizes that are multiples of 32, so its tiny
# model has 2 heads of 32 where `tiny`'s has 4 of 16 (same width, layers and tokenizer; TINY_MODELS). That model
# learns the task faster: after `tiny`'s 15 SFT epochs it already got 0.55 of the held-out sums right, and GRPO
# had nothing left to add (0.50 after), so its SFT stops at 10 epochs.
TINY_VLLM = {name: {**TINY[name], "rollout_engine": "vllm", "sft_epochs": 10} for name in ("rlhf-grpo", "rlhf-ppo")}
# `tiny-agent` is `tiny`'s rlhf-agent run under the name it had first.
PRESETS = {"tiny": TINY, "tiny-reward-hacking": TINY_REWARD_HACKING, "tiny-vllm": TINY_VLLM,
           "tiny-agent": {"rlhf-agent": TINY_AGENT_RUN}}
# The tiny model each preset builds (`write_tiny_model` options), when not the default.
TINY_MODELS = {"tiny-vllm": {"num_heads": 2}}

# Which input URI parameter each file of the tiny task feeds.
TINY_INPUTS = {"sft_train_uri": "sft_train", "sft_eval_uri": "sft_eval", "preference_train_uri": "pref_train",
               "preference_eval_uri": "pref_eval", "unpaired_train_uri": "kto_train", "unpaired_eval_uri": "kto_eval",
               "prompts_uri": "prompts", "eval_prompts_uri": "eval_prompts"}


def write_tiny_inputs(root: Path, model_options: dict[str, Any] | None = None) -> dict[str, str]:
    """Build the tiny model (with `model_options`, e.g. `num_heads`) and task under `root/tiny-inputs` (once)
    and return the input URI parameters."""
    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    directory = root.resolve() / "tiny-inputs"
    model = directory / "-".join(["model", *(f"{key}{value}" for key, value in sorted((model_options or {}).items()))])
    if not (model / "config.json").is_file():
        write_tiny_model(model, **(model_options or {}))
    files = write_task(directory / "data")
    return {"base_model_uri": str(model),
            **{parameter: str(files[name]) for parameter, name in TINY_INPUTS.items()}}


def preset_arguments(preset: str, pipeline: str, root: Path, accepted: set[str] | None = None) -> dict[str, Any]:
    """The parameters a preset sets for `pipeline` (only those the pipeline accepts, where `accepted` is given)."""
    if preset not in PRESETS:
        raise PipelineError(f"--preset {preset!r}: unknown; expected one of {sorted(PRESETS)}")
    if pipeline not in PRESETS[preset]:
        raise PipelineError(f"--preset {preset!r} has no parameters for {pipeline!r}; "
                            f"it applies to {sorted(PRESETS[preset])}")
    arguments = {**write_tiny_inputs(root, TINY_MODELS.get(preset)), **PRESETS[preset][pipeline]}
    if pipeline == "rlhf-agent":  # the tool-use task's files in place of the addition task's
        from trainer.tiny.agent_task import write_agent_task

        files = write_agent_task(root.resolve() / "tiny-inputs" / "agent-data")
        arguments.update({f"{name}_uri": str(path) for name, path in files.items()})
    return {name: value for name, value in arguments.items() if accepted is None or name in accepted}
