"""Loading straight into FSDP2 shards (meta-device build, each rank reads its slices) gives the same model.

Runs 2 CPU processes on gloo (`sharded_load_driver.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.integration.services import free_port

DRIVER = Path(__file__).with_name("sharded_load_driver.py")
REPOSITORY = Path(__file__).parents[3]


def write_reward_model(directory: Path, tiny_model: Path) -> Path:
    """The tiny backbone with a trained-looking head, exported as alignflow exports a reward model."""
    from trainer.config import ModelConfig
    from trainer.modeling.models import export_model, load_tokenizer, load_value_model

    model = load_value_model(ModelConfig(path=str(tiny_model)))
    torch.nn.init.normal_(model.head.weight, std=0.5)
    torch.nn.init.constant_(model.head.bias, 0.25)
    export_model(model, model.state_dict(), load_tokenizer(str(tiny_model)), directory)
    return directory


def test_sharded_load_equals_plain_load_and_each_rank_holds_half(tmp_path, tiny_model):
    reward_model = write_reward_model(tmp_path / "reward-model", tiny_model)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(tiny_model), str(reward_model), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loads = torch.load(tmp_path / "loads.pt")

    plain = loads["plain"]
    for name in ("sharded", "reference"):
        assert loads[name].keys() == plain.keys()
        for key in plain:  # bit for bit: the same bytes of the same file, read in slices
            torch.testing.assert_close(loads[name][key], plain[key], rtol=0, atol=0, msg=f"{name} {key}")
    # Buffers computed in __init__ (rotary frequencies) survived the meta build: the outputs agree too.
    torch.testing.assert_close(loads["logits"]["sharded"], loads["logits"]["plain"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loads["logits"]["reference"], loads["logits"]["plain"], rtol=1e-5, atol=1e-5)
    # Each rank holds about half of the parameters, never all of them.
    assert sum(loads["shard_numel"]) == loads["full_numel"]
    assert max(loads["shard_numel"]) <= 0.55 * loads["full_numel"]
    assert not loads["reference_requires_grad"]
    # A reward model (backbone in shards under the base model's names, its exported head read whole) too.
    value_plain, value_sharded = loads["value_plain"], loads["value_sharded"]
    assert value_sharded.keys() == value_plain.keys()
    for key in value_plain:
        torch.testing.assert_close(value_sharded[key], value_plain[key], rtol=0, atol=0, msg=key)
    assert value_plain["head.bias"].item() == 0.25  # the exported head, not a fresh one
    torch.testing.assert_close(loads["value_outputs"]["sharded"], loads["value_outputs"]["plain"], rtol=1e-5, atol=1e-5)
