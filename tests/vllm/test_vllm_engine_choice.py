"""`rollout.engine: auto` where vLLM is installed: `vllm` on GPUs, and on the CPU only from the crossover
measured in benchmarks/README.md (90M parameters and 128 rows a call) with a head size vLLM's CPU attention
takes. The models are built on the meta device: only their sizes matter here.

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from trainer.config import RolloutConfig  # noqa: E402
from trainer.rollout.engine_choice import VLLM_CPU_MIN_PARAMETERS, choose_engine, parameter_count  # noqa: E402

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def meta_llama(hidden: int, layers: int, heads: int) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, vocab_size=32000)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


LARGE = meta_llama(1024, 8, 16)  # 8 x 1024 with a 32k vocabulary: 0.2B parameters, head size 64
SMALL = meta_llama(128, 2, 2)
ODD_HEADS = meta_llama(1024, 8, 64)  # head size 16: not one vLLM's CPU attention takes


def test_the_models_straddle_the_crossover():
    assert parameter_count(SMALL) < VLLM_CPU_MIN_PARAMETERS <= parameter_count(LARGE)


@pytest.mark.parametrize(("model", "rows", "device", "engine", "why"), [
    (LARGE, 256, CPU, "vllm", "at or above vllm's crossover"),
    (LARGE, 128, CPU, "vllm", "at or above vllm's crossover"),
    (LARGE, 64, CPU, "hf", "below vllm's crossover"),
    (SMALL, 256, CPU, "hf", "below vllm's crossover"),
    (ODD_HEADS, 256, CPU, "hf", "no head size 16"),
    (SMALL, 8, GPU, "vllm", "on GPUs"),
])
def test_auto_chooses_vllm_only_where_it_pays_off(model, rows, device, engine, why):
    chosen, reason = choose_engine(RolloutConfig(engine="auto"), model, rows, device)
    assert chosen == engine and why in reason, reason
