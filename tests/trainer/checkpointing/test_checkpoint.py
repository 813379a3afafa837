"""Checkpoints: resuming reproduces an uninterrupted run exactly; partial checkpoints are never used."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_config
from trainer.checkpointing.checkpoint import CheckpointManager, TrainerState
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv
from trainer.supervised.stages import run_stage


def exported_weights(directory) -> dict[str, torch.Tensor]:
    return load_file(directory / "model" / "model.safetensors")


# 80 samples, micro-batch 8: 10 micro-batches an epoch, 20 over two epochs; each stop is mid-epoch.
@pytest.mark.parametrize(("stop_after", "accumulation"), [(5, 1), (17, 1), (4, 2)])
def test_resume_mid_run_gives_identical_parameters(stop_after, accumulation, tmp_path, tiny_model, task_files):
    def config(name):
        return make_config("sft", tmp_path / name, tiny_model, task_files["sft_train"],
                           train={"max_epochs": 2, "micro_batch_size": 8, "gradient_accumulation_steps": accumulation},
                           optimizer={"lr": 2e-3, "warmup_steps": 3})

    run_stage(config("straight"))
    stopped = run_stage(config("resumed"), stop_after_steps=stop_after)
    assert not (tmp_path / "resumed" / "model").exists()  # it really stopped early
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "step-{:08d}".format(stop_after) /
                        "trainer_state.json").read_text())
    assert state["global_step"] == stop_after and stopped.metrics
    run_stage(config("resumed"))

    straight, resumed = exported_weights(tmp_path / "straight"), exported_weights(tmp_path / "resumed")
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def test_resume_of_reward_model_restores_value_head(tmp_path, tiny_model, task_files):
    def config(name):
        return make_config("rm", tmp_path / name, tiny_model, task_files["pref_eval"], train={"max_epochs": 2})

    run_stage(config("straight"))
    run_stage(config("resumed"), stop_after_steps=13)
    run_stage(config("resumed"))
    straight = load_file(tmp_path / "straight" / "model" / "value_head.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model" / "value_head.safetensors")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def make_manager(root, keep_last=0):
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return CheckpointManager(root, booster, keep_last), model, optimizer, scheduler


def test_half_written_checkpoint_is_ignored(tmp_path):
    manager, model, optimizer, scheduler = make_manager(tmp_path)
    manager.save({"model": (model, optimizer, scheduler)}, TrainerState(global_step=2), 2)
    # A crash while writing step 3: its files exist but `latest` was never moved to it.
    partial = tmp_path / "step-00000003"
    partial.mkdir()
    torch.save(model.state_dict(), partial / "model.pt")
    assert manager.latest() == str(tmp_path / "step-00000002")


def test_no_checkpoint_means_fresh_start(tmp_path):
    manager, *_ = make_manager(tmp_path / "none")
    assert manager.latest() is None


def test_retention_keeps_the_last_complete_checkpoints(tmp_path):
    manager, model, optimizer, scheduler = make_manager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        manager.save({"model": (model, optimizer, scheduler)}, TrainerState(global_step=step), step)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]
    assert manager.latest().endswith("/step-00000004")


def test_load_restores_weights_and_position(tmp_path):
    manager, model, optimizer, scheduler = make_manager(tmp_path)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    components = {"model": (model, optimizer, scheduler)}
    manager.save(components, TrainerState(epoch=1, global_step=7, samples_in_epoch=24), 7)
    torch.nn.init.zeros_(model.weight)
    state = manager.load(manager.latest(), components)
    assert (state["epoch"], state["global_step"], state["samples_in_epoch"]) == (1, 7, 24)
    assert torch.equal(model.weight, saved["weight"])


def test_rng_state_round_trips_through_its_safetensors_file_exactly():
    import random

    import numpy as np

    from trainer.checkpointing.checkpoint import (
        capture_rng_state,
        decode_rng_state,
        encode_rng_state,
        restore_rng_state,
    )

    random.gauss(0, 1), np.random.standard_normal()  # cached gaussians are part of the state
    payload = encode_rng_state(capture_rng_state())
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3))
    torch.manual_seed(123), random.seed(1), np.random.seed(2)
    restore_rng_state(decode_rng_state(payload, "rng-rank0.safetensors"))
    assert (random.random(), np.random.standard_normal(3).tolist()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
