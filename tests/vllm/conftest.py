"""Fixtures of the vLLM tests: a tiny Llama vLLM's CPU attention can run, and the same after a short SFT.

vLLM's CPU attention takes head sizes that are multiples of 32 (32, 64, 80, ...); the project's tiny
model has 4 heads of 16 over its 64-wide hidden state, so these tests build it with 2 heads of 32
(same width, layers and tokenizer). Everything else (the task, the reward, the stages) is the one
`make test` uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_config


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory) -> Path:
    from trainer.tiny.model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-vllm") / "model", num_heads=2)


@pytest.fixture(scope="session")
def vllm_start_model(tmp_path_factory, vllm_tiny_model, task_files) -> Path:
    """Briefly fine-tuned (as `rl_start_model`): answers in the task's format, many sums wrong."""
    from trainer.supervised.stages import run_stage

    output = tmp_path_factory.mktemp("sft-vllm")
    run_stage(make_config("sft", output, vllm_tiny_model, task_files["sft_train"], None,
                          optimizer={"lr": 3e-3, "warmup_steps": 5}, train={"max_epochs": 20, "micro_batch_size": 16}))
    return output / "model"
