"""`PPOAlgorithm`: what PPO declares to the loops (a critic, ptx data, an adaptive KL coefficient), and its
advantages on a hand-built batch. When it needs a reference: `tests/trainer/online/test_less_work.py`."""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms.online.ppo import PPOAlgorithm, critic_metric_names
from trainer.algorithms.online.registry import online_algorithm
from trainer.algorithms.ppo import PPOActorObjective, PPOCriticObjective
from trainer.config import build_config
from trainer.rollout.experience import Experience


def config(**ppo):
    return build_config("ppo", {"output_dir": "o", "model": {"path": "m"}, "data": {"train_path": "p"},
                                "reward": {"function": "tiny_addition"}, "ppo": ppo})


def test_ppo_needs_a_critic_and_builds_both_objectives():
    algorithm = online_algorithm(config(cliprange=0.1, vf_coef=0.5))
    assert isinstance(algorithm, PPOAlgorithm) and algorithm.name == "ppo" and algorithm.needs_critic
    actor, critic = algorithm.build_actor_objective(), algorithm.build_critic_objective()
    assert isinstance(actor, PPOActorObjective) and actor.cliprange == 0.1 and actor.correction is None
    assert isinstance(critic, PPOCriticObjective) and critic.vf_coef == 0.5
    assert algorithm.counted_info == () and algorithm.episode_metrics({"rows": 4.0}) == {}


def test_ppo_reads_ptx_data_only_when_set():
    assert online_algorithm(config()).ptx_data_path is None
    assert online_algorithm(config(ptx_data_path="sft.jsonl", ptx_coef=0.1)).ptx_data_path == "sft.jsonl"


def test_ppo_kl_coefficient_adapts_towards_target_kl():
    fixed = online_algorithm(config(kl_coef=0.05)).build_kl_controller()
    fixed.update(10.0, 64)
    assert fixed.value == 0.05
    adaptive = online_algorithm(config(kl_coef=0.05, target_kl=0.1, kl_horizon=64)).build_kl_controller()
    adaptive.update(10.0, 64)  # far above the target: the error clips at +0.2
    assert adaptive.value == pytest.approx(0.05 * 1.2)


def test_ppo_advantages_put_the_score_on_the_last_token_and_gae_over_it():
    # One row, two response tokens, values 0, no reference: rewards (0, 1); gamma = lam = 1: advantages (1, 1).
    batch = Experience(input_ids=torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3),
                       action_mask=torch.tensor([[0, 1, 1]]), position_ids=torch.arange(3)[None],
                       scores=torch.tensor([1.0]), values=torch.zeros(1, 3))
    out = online_algorithm(config(gamma=1.0, lam=1.0, whiten_advantages=False)).compute_advantages(batch, kl_coef=0.1)
    torch.testing.assert_close(out.rewards, torch.tensor([[0.0, 0.0, 1.0]]))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 1.0, 1.0]]))
    torch.testing.assert_close(out.returns, out.advantages)  # values 0


def test_critic_metrics_keep_value_names_and_prefix_the_rest():
    assert critic_metric_names({"value_loss": 1.0, "grad_norm": 2.0}) == {"value_loss": 1.0, "critic/grad_norm": 2.0}
