"""`rollout.engine: auto`: which engine samples a run, chosen once the policy is loaded.

vLLM only pays off where its batched decoding outweighs what it costs beside the trainer: its start,
a second copy of the weights, a weight sync every step and, for the rollout correction, the trainer's
log-probs of its tokens. On a GPU that is the common case (it is why every RL framework ships it; not
measured here, as no GPU was lent). On this project's CPUs it is rare (benchmarks/README.md, "Where
vLLM overtakes hf"): a 3.2M-parameter model trained 0.66-0.83x as fast end to end with `vllm` as with
`hf`, even at 256 completions a call; a 96M one was about even at 64 and 1.1x at 256. `auto`
therefore picks `vllm` on the CPU only from `VLLM_CPU_MIN_PARAMETERS` parameters and
`VLLM_CPU_MIN_ROWS` rows a call. `trainer.rollout.builder.build_rollout` asks once per rollout it builds.
"""

from __future__ import annotations

from importlib.util import find_spec

import torch
from torch import nn

from trainer.config import RolloutConfig
from trainer.parallel.booster import unwrap_model

VLLM_CPU_MIN_PARAMETERS = 90_000_000  # the 96M model of the benchmark, where vllm first won
VLLM_CPU_MIN_ROWS = 128  # between the even 64 and the winning 256 completions a call


def parameter_count(model: nn.Module) -> int:
    """All of `model`'s parameters (a sharded parameter counts whole: DTensor's numel is the global one)."""
    return sum(parameter.numel() for parameter in unwrap_model(model).parameters())


def choose_engine(rollout: RolloutConfig, model: nn.Module | None, rows_per_call: int,
                  device: torch.device) -> tuple[str, str]:
    """The engine that samples `model`, `rows_per_call` rows at a time on `device`, and why.

    Args:
        rollout: The `rollout` section; an engine other than `auto` is kept as it is.
        model: The policy (possibly wrapped), for its size and head size; None only with an engine named outright.
        rows_per_call: Sequences one rollout call samples on this rank (prompts x samples per prompt).
        device: Where the trainer runs.

    Returns:
        `hf` or `vllm`, and the reason in words (for the log).
    """
    if rollout.engine != "auto":
        return rollout.engine, "set in rollout.engine"
    if find_spec("vllm") is None:
        return "hf", "vLLM is not installed (the image's vLLM variant has it)"
    if device.type == "cuda":
        return "vllm", "vLLM is installed and the run is on GPUs"
    if device.type != "cpu":
        return "hf", f"vLLM has no build for {device.type} here"
    parameters = parameter_count(model)
    if parameters < VLLM_CPU_MIN_PARAMETERS or rows_per_call < VLLM_CPU_MIN_ROWS:
        return "hf", (f"on the CPU {parameters / 1e6:.1f}M parameters x {rows_per_call} rows a call is below "
                      f"vllm's crossover ({VLLM_CPU_MIN_PARAMETERS / 1e6:.0f}M x {VLLM_CPU_MIN_ROWS})")
    from trainer.rollout.vllm_engine import cpu_head_size_problem  # imports vLLM's attention backend

    problem = cpu_head_size_problem(unwrap_model(model).config.to_dict())
    if problem is not None:
        return "hf", problem
    return "vllm", (f"on the CPU {parameters / 1e6:.1f}M parameters x {rows_per_call} rows a call is at or above "
                    f"vllm's crossover ({VLLM_CPU_MIN_PARAMETERS / 1e6:.0f}M x {VLLM_CPU_MIN_ROWS})")

