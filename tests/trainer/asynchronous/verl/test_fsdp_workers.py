"""Tests of `ActorRolloutRefWorker` and `CriticWorker` on the tiny model: the seed's methods do what they say."""

import pytest
import torch

from tests.conftest import make_config
from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import response_logps
from trainer.asynchronous.verl.data_proto import DataProto
from trainer.asynchronous.verl.fsdp_checkpoint_manager import CheckpointMonitor
from trainer.asynchronous.verl.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from trainer.checkpointing.checkpoint import CheckpointManager
from trainer.errors import ConfigError
from trainer.lifecycle.context import build_context
from trainer.rollout.experience import Experience


@pytest.fixture
def workers(tmp_path, tiny_model, task_files):
    config = make_config("ppo", tmp_path / "run", tiny_model, task_files["prompts"], train={"micro_batch_size": 2},
                         optimizer={"lr": 1e-2, "scheduler": "constant"}, reward={"function": "trainer.tiny.task:reward"},
                         ppo={"rollout_batch_size": 4, "mini_batch_size": 4})
    context = build_context(config)
    monitor = CheckpointMonitor(CheckpointManager(context.checkpoint_root(), context.booster), {"actor", "critic"})
    actor = ActorRolloutRefWorker(config, context, monitor, total_steps=10)
    critic = CriticWorker(config, context, monitor, total_steps=10)
    actor.init_model()
    critic.init_model()
    actor.set_algorithm(config)
    return config, actor, critic


def make_data(vocab_size: int) -> DataProto:
    torch.manual_seed(0)
    input_ids = torch.randint(3, vocab_size, (4, 6))  # (B, T): 2 prompt tokens, 4 response tokens
    action_mask = torch.tensor([[0, 0, 1, 1, 1, 1]] * 4)
    batch = Experience(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), action_mask=action_mask,
                       position_ids=torch.arange(6).repeat(4, 1), scores=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    return DataProto(batch, {"model_versions": torch.zeros(4, dtype=torch.long)})


def test_log_probs_values_and_updates_of_the_workers(workers):
    config, actor, critic = workers
    data = make_data(actor.module.config.vocab_size)
    data = data.union(actor.compute_log_prob(data))
    expected = response_logps(actor.module, data.batch.as_batch()) * data.batch.action_mask
    torch.testing.assert_close(data.batch.old_logps, expected)
    data = data.union(actor.compute_ref_log_prob(data))
    torch.testing.assert_close(data.batch.ref_logps, data.batch.old_logps)  # untrained actor = reference
    data = data.union(critic.compute_values(data))
    assert data.batch.values.shape == (4, 6) and data.batch.values[:, :2].abs().sum() == 0  # 0 outside the response
    data = DataProto(online_algorithm(config).compute_advantages(data.batch, kl_coef=0.05), data.meta_info)

    before = {k: v.clone() for k, v in actor.module.state_dict().items()}
    critic_metrics = critic.update_critic(data, torch.Generator().manual_seed(0))
    actor_metrics = actor.update_actor(data, torch.Generator().manual_seed(0))
    assert actor_metrics["num_optimizer_steps"] == 1 and "loss" in actor_metrics and "grad_norm" in actor_metrics
    assert critic_metrics["critic/num_optimizer_steps"] == 1 and "value_loss" in critic_metrics
    assert any(not torch.equal(before[k], v) for k, v in actor.module.state_dict().items())
    refreshed = actor.compute_ref_log_prob(data)["ref_logps"]
    torch.testing.assert_close(refreshed, data.batch.ref_logps)  # the reference stayed frozen


def test_clear_optimizer_state_forgets_the_moments(workers):
    config, actor, critic = workers
    data = make_data(actor.module.config.vocab_size)
    data = data.union(actor.compute_log_prob(data)).union(actor.compute_ref_log_prob(data))
    data = data.union(critic.compute_values(data))
    data = DataProto(online_algorithm(config).compute_advantages(data.batch, kl_coef=0.05), data.meta_info)
    actor.update_actor(data, torch.Generator().manual_seed(0))
    critic.update_critic(data, torch.Generator().manual_seed(0))
    assert actor.actor.actor_optimizer.state and critic.critic.critic_optimizer.state
    actor.clear_optimizer_state()
    critic.clear_optimizer_state()
    assert not actor.actor.actor_optimizer.state and not critic.critic.critic_optimizer.state


def test_sync_weight_says_which_channels_exist(workers):
    _, actor, _ = workers
    actor.setup_weight_sync_group()  # nothing to set up
    with pytest.raises(ConfigError, match="save_state_dict.*upload_state_dict"):
        actor.sync_weight()
