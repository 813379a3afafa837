"""Tests of `trainer.asynchronous.verl.fsdp_checkpoint_manager`: three ways to hand out weights, and one
atomic checkpoint for actor and critic together. Small linear models stand in for the policy and critic."""

import json

import torch
from torch import nn

from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.verl.fsdp_checkpoint_manager import CheckpointMonitor, FSDPCheckpointManager
from trainer.asynchronous.weights import latest_version, load_version
from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.parallel.booster import Booster, SinglePlugin
from trainer.runtime import DistributedEnv


def make_parts(booster: Booster, seed: int):
    torch.manual_seed(seed)
    model, *_ = booster.boost(nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    booster.register_optimizer(model, optimizer)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def make_managers(tmp_path, synchronizer=None):
    booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    checkpoints = CheckpointManager(tmp_path / "checkpoints", booster)
    monitor = CheckpointMonitor(checkpoints, {"actor", "critic"})
    actor = FSDPCheckpointManager("actor", booster, make_parts(booster, 0), monitor, str(tmp_path / "weights"),
                                  synchronizer)
    critic_booster = Booster(SinglePlugin(DistributedEnv(0, 0, 1), torch.device("cpu")))
    critic = FSDPCheckpointManager("critic", critic_booster, make_parts(critic_booster, 1), monitor)
    return checkpoints, actor, critic


def test_a_step_becomes_latest_only_once_every_role_has_saved(tmp_path):
    checkpoints, actor, critic = make_managers(tmp_path)
    critic.save_checkpoint(3, block=True)
    assert checkpoints.latest() is None  # the actor's share is missing
    actor.save_checkpoint(3, {"train_step": 3}, block=True)
    directory = tmp_path / "checkpoints" / "step-00000003"
    assert checkpoints.latest() == str(directory)
    assert {"actor.pt", "critic.pt", "actor.optimizer.pt", "critic.scheduler.pt"} <= {p.name for p in directory.iterdir()}
    assert json.loads((directory / "trainer_state.json").read_text()) == {"train_step": 3}


def test_load_checkpoint_restores_each_roles_weights(tmp_path):
    checkpoints, actor, critic = make_managers(tmp_path)
    saved = {k: v.clone() for k, v in critic.model.state_dict().items()}
    actor.save_checkpoint(1, {"train_step": 1}, block=True)
    critic.save_checkpoint(1, block=True)
    with torch.no_grad():
        critic.model.weight.add_(1.0)
    state = critic.load_checkpoint(checkpoints.latest())
    assert state == {"train_step": 1}
    torch.testing.assert_close(critic.model.state_dict(), saved)


def test_save_state_dict_publishes_the_policy_as_a_weight_version(tmp_path):
    _, actor, _ = make_managers(tmp_path)
    actor.save_state_dict(5)
    version, state = load_version(tmp_path / "weights")
    assert version == 5 == latest_version(tmp_path / "weights")
    torch.testing.assert_close(state, actor.model.state_dict())
    assert not (tmp_path / "checkpoints").exists()  # publishing is not checkpointing


def test_upload_state_dict_hands_the_synchronizer_a_copy(tmp_path):
    synchronizer = Synchronizer()
    _, actor, _ = make_managers(tmp_path, synchronizer)
    actor.upload_state_dict(2)
    before = actor.model.weight.detach().clone()
    with torch.no_grad():
        actor.model.weight.add_(1.0)  # training goes on after the upload
    version, state = synchronizer.get_model_state_dict()
    assert version == 2
    torch.testing.assert_close(state["weight"], before)
    assert not (tmp_path / "weights").exists()
