"""SFT and DPO through ColossalAI's own Booster and TorchDDPPlugin on 2 gloo ranks (torchrun).

Runs only in the ColossalAI environment (`make test-colossalai`: torch 2.5.1, transformers 4.51.3,
colossalai 0.5.0); elsewhere the module is skipped. Each test would fail if training went around
ColossalAI: the boosted model must be ColossalAI's `TorchDDPModel`, and checkpoints must hold
ColossalAI's optimizer state (keyed by parameter index, where the other boosters key by name).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("colossalai", reason="ColossalAI runs in its own environment: make test-colossalai")

import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tests.conftest import stage_dict  # noqa: E402
from tests.integration.services import free_port  # noqa: E402
from trainer.config import build_config  # noqa: E402
from trainer.supervised.stages import run_stage  # noqa: E402

DRIVER = Path(__file__).with_name("torchrun_colossalai.py")
COLOSSALAI = {"plugin": "colossalai", "colossalai": {"plugin": "torch_ddp"}}


def run_torchrun(stage: str, config: dict, directory: Path, stop_after_steps: int | None = None) -> list[dict]:
    """Train under torchrun on 2 gloo ranks; each rank's weights and report, in rank order."""
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / f"{stage}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), stage, str(config_path), str(directory)]
    if stop_after_steps is not None:
        command.append(str(stop_after_steps))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    # Its own session, so a timeout ends torchrun and both ranks, not torchrun alone.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=500)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    assert process.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return [{"state": torch.load(directory / f"rank{rank}.pt", weights_only=True),
             **json.loads((directory / f"rank{rank}.json").read_text())} for rank in range(2)]


def run_single(stage: str, config: dict) -> dict[str, torch.Tensor]:
    result = run_stage(build_config(stage, config))
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def assert_states_close(left: dict, right: dict, **tolerance) -> None:
    assert left.keys() == right.keys()
    for key in left:
        torch.testing.assert_close(left[key], right[key], msg=lambda m, key=key: f"{key}: {m}", **tolerance)


def losses(output_dir: Path) -> list[float]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [row["loss"] for row in map(json.loads, lines) if "loss" in row]


def sft_config(root: Path, name: str, tiny_model: Path, task_files: dict, micro_batch_size: int,
               parallel: dict, **train) -> dict:
    # sft.packing is left at its default: null, which pads under transformers 4.51.3.
    return stage_dict("sft", root / name, tiny_model, task_files["sft_train"],
                      optimizer={"lr": 3e-3, "warmup_steps": 0, "scheduler": "constant"},
                      train={"micro_batch_size": micro_batch_size, "gradient_accumulation_steps": 2,
                             "log_interval": 1, **train},
                      parallel=parallel)


def test_sft_through_torch_ddp_plugin_agrees_across_ranks_and_with_one_process(tmp_path, tiny_model, task_files):
    rank0, rank1 = run_torchrun("sft", sft_config(tmp_path, "two", tiny_model, task_files, 5, COLOSSALAI,
                                                  max_epochs=2), tmp_path / "two")
    single = run_single("sft", sft_config(tmp_path, "one", tiny_model, task_files, 10, {"plugin": "single"},
                                          max_epochs=2))

    assert rank0["model_class"] == "colossalai.booster.plugin.torch_ddp_plugin.TorchDDPModel"
    assert_states_close(rank0["state"], rank1["state"], rtol=0, atol=0)
    assert_states_close(rank0["state"], single, rtol=1e-4, atol=1e-5)
    initial = load_file(tiny_model / "model.safetensors")
    assert not torch.allclose(rank0["state"]["model.embed_tokens.weight"], initial["model.embed_tokens.weight"],
                              atol=1e-3)
    curve = losses(tmp_path / "two")
    assert len(curve) >= 4 and sum(curve[-2:]) < 0.8 * sum(curve[:2]), curve
    assert (tmp_path / "two" / "model" / "config.json").is_file()


def test_dpo_through_torch_ddp_plugin_agrees_across_ranks_and_with_one_process(tmp_path, tiny_model, task_files):
    def config(name: str, micro_batch_size: int, parallel: dict) -> dict:
        # 100 pairs, 10 steps an epoch; the reference model is live (not precomputed) beside the boosted policy.
        return stage_dict("dpo", tmp_path / name, tiny_model, task_files["pref_eval"],
                          optimizer={"lr": 2e-3, "warmup_steps": 0, "scheduler": "constant"},
                          train={"micro_batch_size": micro_batch_size, "log_interval": 1, "max_epochs": 3},
                          parallel=parallel)

    rank0, rank1 = run_torchrun("dpo", config("two", 5, COLOSSALAI), tmp_path / "two")
    single = run_single("dpo", config("one", 10, {"plugin": "single"}))

    assert rank0["model_class"].endswith("TorchDDPModel")
    assert_states_close(rank0["state"], rank1["state"], rtol=0, atol=0)
    assert_states_close(rank0["state"], single, rtol=1e-3, atol=1e-4)  # 30 Adam steps of float drift
    curve = losses(tmp_path / "two")
    epochs = [sum(curve[i:i + 10]) / 10 for i in (0, 10, 20)]  # per-step DPO loss is noisy; epoch means fall
    assert len(curve) == 30 and epochs[0] > epochs[1] > epochs[2] and epochs[2] < 0.95 * epochs[0], epochs


def test_checkpoint_through_colossalai_saves_and_resumes_to_the_same_weights(tmp_path, tiny_model, task_files):
    def config(name: str) -> dict:
        return sft_config(tmp_path, name, tiny_model, task_files, 5, COLOSSALAI, max_epochs=1)

    straight, _ = run_torchrun("sft", config("straight"), tmp_path / "straight")
    stopped, _ = run_torchrun("sft", config("resumed"), tmp_path / "stopped", stop_after_steps=2)
    checkpoint = tmp_path / "resumed" / "checkpoints" / "step-00000002"
    optimizer_state = torch.load(checkpoint / "model.optimizer.pt", weights_only=True)
    resumed, _ = run_torchrun("sft", config("resumed"), tmp_path / "resumed-run")

    # ColossalAI's unsharded optimizer state: torch's own layout, parameters by index.
    assert sorted(optimizer_state["state"]) == list(range(len(optimizer_state["state"])))
    assert not torch.equal(stopped["state"]["model.embed_tokens.weight"], resumed["state"]["model.embed_tokens.weight"])
    assert_states_close(resumed["state"], straight["state"], rtol=1e-5, atol=1e-6)
