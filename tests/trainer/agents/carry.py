"""The two-batch scenario both carry tests run (`hf` in tests/trainer/agents/test_training.py, vLLM in
tests/vllm/test_vllm_agents.py): an explorer whose first batch leaves one group waiting at its first step, new
weights, and a second batch in which only that carried group can complete."""

from __future__ import annotations

import copy
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.conftest import make_config
from tests.trainer.agents.environments import GatedEnvironment

GATED = "gated=tests.trainer.agents.environments:GatedEnvironment"


def carry_config(output: Path, model: Path, prompts: Path, **sections):
    """GRPO on `gated` with one over-sampled group a batch (1 + 1 groups of 2) and max_staleness 1."""
    return make_config("grpo", output, model, prompts, train={"micro_batch_size": 8}, data={"max_length": 32},
                       # Most characters stop a turn, so the random model's turns end within their budget
                       # (a turn cut by it would end its episode before its environment is asked).
                       generation={"max_new_tokens": 12, "temperature": 1.0,
                                   "stop": list(string.ascii_letters + string.digits)},
                       reward={"function": "tiny_calculator"},
                       environment={"name": "gated", "max_turns": 2, "max_total_tokens": 64, "schedule": "as_ready",
                                    "oversample_groups": 1},
                       grpo={"rollout_batch_size": 1, "num_generations": 2, "mini_batch_size": 2},
                       asynchronous={"sync_offset": 1}, **sections)


@dataclass
class CarriedRun:
    first: object  # batch 1's Experience
    second: object  # batch 2's
    carried: list  # the carried group's episodes (as they ended)
    turn_one: list[list[int]]  # each one's tokens when carried: its first turn, sampled under version 0
    recorded: list[list[float]]  # their behaviour log-probs then


def run_carried_batches(explorer, monkeypatch) -> CarriedRun:
    """Batch 1 under version 0, its second group held at its first step and carried; new weights (version 1,
    synced into the engine); batch 2, whose new groups wait, so that it is the carried group."""
    upcoming = [str(row["prompt"]) for row in copy.deepcopy(explorer.prompts).take(4)]  # two prompts a batch
    held, later = threading.Event(), threading.Event()
    monkeypatch.setattr(GatedEnvironment, "GATES", {upcoming[1]: held, upcoming[2]: later, upcoming[3]: later})
    try:
        explorer.version = 0
        first = explorer.make_batch(1)
        carried = list(explorer.carry.episodes)
        assert [str(e.row["prompt"]) for e in carried] == [upcoming[1]] * 2 and not any(e.done for e in carried)
        turn_one, recorded = [list(e.ids) for e in carried], [list(e.logps) for e in carried]
        with torch.no_grad():
            for parameter in explorer.policy.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        explorer.rollout.sync_weights(explorer.policy)  # `hf` samples with the policy itself: nothing to copy
        explorer.version = 1
        held.set()
        deadline = time.monotonic() + 20
        while not all(future.done() for future in explorer.carry.steps.stepping):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        second = explorer.make_batch(2)
    finally:
        held.set()
        later.set()
    return CarriedRun(first, second, carried, turn_one, recorded)
