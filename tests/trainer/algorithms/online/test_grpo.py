"""`GRPOAlgorithm` (what the colocated loop and the asynchronous engine both ask): each advantage estimator on a
hand-built batch, DAPO's shaping, what gets dropped from the loss, the episode's counts, and what GRPO needs."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.advantages import STD_EPS
from trainer.algorithms.online.grpo import GRPOAlgorithm
from trainer.algorithms.online.registry import online_algorithm
from trainer.config import build_config
from trainer.rollout.experience import Experience, concat_experiences

# Two groups of two responses, each one prompt column and up to three response columns.
ACTION_MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]])  # lengths 2, 3, 1, 2


def config(**grpo):
    return build_config("grpo", {"output_dir": "o", "model": {"path": "m"}, "data": {"train_path": "p"},
                                 "reward": {"function": "tiny_addition"}, "generation": {"max_new_tokens": 3},
                                 "grpo": {"num_generations": 2, **grpo}})


def compute_advantages(batch: Experience, stage_config, kl_coef: float) -> Experience:
    return online_algorithm(stage_config).compute_advantages(batch, kl_coef)


def experience(scores, truncated=(0.0, 1.0, 0.0, 0.0), kl_per_token: float = 0.0) -> Experience:
    ids = torch.ones(4, 4, dtype=torch.long)
    old = torch.zeros(4, 4)
    return Experience(input_ids=ids, attention_mask=torch.ones(4, 4), action_mask=ACTION_MASK,
                      position_ids=torch.arange(4).expand(4, 4), scores=torch.tensor(scores),
                      truncated=torch.tensor(truncated), old_logps=old, ref_logps=old - kl_per_token * ACTION_MASK)


def test_grpo_puts_the_group_normalised_score_on_every_response_token():
    out = compute_advantages(experience([1.0, 0.0, 3.0, 1.0]), config(), kl_coef=0.0)
    # Group 1: scores 1, 0: deviations +-0.5, unbiased std sqrt(0.5). Group 2: 3, 1: +-1, std sqrt(2).
    # So about +-1/sqrt(2) each (TRL's 1e-4 is added to the std).
    first, second = 0.5 / (math.sqrt(0.5) + STD_EPS), 1 / (math.sqrt(2) + STD_EPS)
    per_row = [first, -first, second, -second]
    torch.testing.assert_close(out.advantages, torch.tensor(per_row)[:, None] * ACTION_MASK)
    torch.testing.assert_close(out.loss_mask, ACTION_MASK.float())  # nothing dropped by default


def test_dr_grpo_only_centres_and_rloo_subtracts_the_other_responses_score():
    out = compute_advantages(experience([1.0, 0.0, 3.0, 1.0]), config(scale_rewards="none"), kl_coef=0.0)
    torch.testing.assert_close(out.advantages[:, 1], torch.tensor([0.5, -0.5, 1.0, -1.0]))
    rloo = compute_advantages(experience([1.0, 0.0, 3.0, 1.0]), config(advantage_estimator="rloo"), kl_coef=0.0)
    torch.testing.assert_close(rloo.advantages[:, 1], torch.tensor([1.0, -1.0, 2.0, -2.0]))  # n = 2: r_i - r_j


def test_rloo_takes_beta_times_the_summed_kl_off_each_score():
    # k1 = 0.5 per response token: the scores lose 0.1 * 0.5 * length = 0.1, 0.15, 0.05, 0.1.
    out = compute_advantages(experience([1.0, 0.0, 3.0, 1.0], kl_per_token=0.5),
                             config(advantage_estimator="rloo", beta=0.1), kl_coef=0.0)
    penalised = [0.9, -0.15, 2.95, 0.9]
    torch.testing.assert_close(out.advantages[:, 1], torch.tensor([penalised[0] - penalised[1], penalised[1] - penalised[0],
                                                                   penalised[2] - penalised[3], penalised[3] - penalised[2]]))


def test_reinforce_plus_plus_normalises_the_kl_shaped_returns_over_the_batchs_tokens():
    out = compute_advantages(experience([1.0, 0.0, 3.0, 1.0], kl_per_token=0.5),
                             config(advantage_estimator="reinforce_plus_plus", beta=0.1), kl_coef=0.0)
    mask = ACTION_MASK.bool()
    values = out.advantages[mask]
    torch.testing.assert_close(values.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(values.std(), torch.tensor(1.0), atol=1e-3, rtol=0)  # (x - mean) / (std + 1e-4)
    assert torch.all(out.advantages[~mask] == 0)
    # Row 0 before normalising: rewards -0.05, 1 - 0.05 -> returns 0.9, 0.95 (gamma 1); the first token's is lower.
    assert out.advantages[0, 1] < out.advantages[0, 2]


def test_dynamic_sampling_drops_groups_that_all_score_the_same_from_the_loss_and_counts_them():
    out = compute_advantages(experience([1.0, 1.0, 3.0, 1.0]), config(dynamic_sampling=True), kl_coef=0.0)
    torch.testing.assert_close(out.loss_mask, ACTION_MASK.float() * torch.tensor([0.0, 0.0, 1.0, 1.0])[:, None])
    assert out.info["dropped_groups"] == 1.0 and out.info["rows"] == 4.0


def test_masked_truncated_completions_leave_the_loss_but_still_shape_the_baseline():
    plain = compute_advantages(experience([1.0, 0.0, 3.0, 1.0]), config(), kl_coef=0.0)
    masked = compute_advantages(experience([1.0, 0.0, 3.0, 1.0]), config(mask_truncated_completions=True), kl_coef=0.0)
    torch.testing.assert_close(masked.advantages, plain.advantages)  # row 1 still in its group's mean and std
    torch.testing.assert_close(masked.loss_mask[1], torch.zeros(4))
    assert masked.info["truncated"] == 1.0


def test_the_overlong_penalty_is_added_to_the_scores_before_the_advantage():
    # max_new_tokens 3, buffer 2: free up to 1 token, then -1/2 per token: lengths 2, 3, 1, 2 -> -0.5, -1, 0, -0.5.
    # Shaped scores 0.5, 0, 0, -0.5: in each tied group the shorter answer now wins by 0.5.
    out = compute_advantages(experience([1.0, 1.0, 0.0, 0.0]), config(overlong_buffer_length=2, scale_rewards="none"),
                             kl_coef=0.0)
    torch.testing.assert_close(out.advantages[:, 1], torch.tensor([0.25, -0.25, 0.25, -0.25]))
    assert out.info["overlong_penalty"] == pytest.approx(-2.0)


def test_episode_counts_add_up_over_collect_steps_and_become_metrics():
    parts = [compute_advantages(experience([1.0, 1.0, 3.0, 1.0]), config(dynamic_sampling=True), kl_coef=0.0)] * 2
    info = concat_experiences(parts, pad_token_id=0).info
    assert info["dropped_groups"] == 2.0 and info["rows"] == 8.0
    metrics = GRPOAlgorithm(config()).episode_metrics(info)
    assert metrics["episode/dropped_groups"] == 2.0 and metrics["episode/truncated_fraction"] == 0.25


# ---- what GRPO declares to the loops -----------------------------------------------------------------------------


def test_grpo_needs_no_critic_and_a_reference_only_with_beta():
    algorithm = online_algorithm(config(beta=0.0))
    assert isinstance(algorithm, GRPOAlgorithm) and algorithm.name == "grpo"
    assert not algorithm.needs_critic and algorithm.build_critic_objective() is None
    assert not algorithm.needs_reference
    assert online_algorithm(config(beta=0.04)).needs_reference
    assert algorithm.ptx_data_path is None  # no pretraining loss


def test_grpo_reward_kl_coefficient_is_zero_and_never_moves():
    controller = online_algorithm(config(beta=0.04)).build_kl_controller()
    controller.update(10.0, 64)  # no target: the KL is in GRPO's loss or advantages, not the reward
    assert controller.value == 0.0


@pytest.mark.parametrize(("estimator", "beta_in_loss"), [("grpo", 0.04), ("rloo", 0.0), ("reinforce_plus_plus", 0.0)])
def test_grpo_objective_carries_beta_only_when_the_kl_is_in_the_loss(estimator, beta_in_loss):
    scale = {} if estimator == "grpo" else {"scale_rewards": "none"}
    objective = online_algorithm(config(beta=0.04, advantage_estimator=estimator, **scale)).build_actor_objective()
    assert objective.beta == beta_in_loss and objective.max_completion_length == 3  # generation.max_new_tokens


def test_grpo_counts_what_its_episode_metrics_read():
    algorithm = online_algorithm(config(dynamic_sampling=True))
    out = algorithm.compute_advantages(experience([1.0, 1.0, 3.0, 1.0]), kl_coef=0.0)
    assert set(algorithm.counted_info) <= set(out.info)
    counts = {key: out.info[key] for key in algorithm.counted_info}
    assert algorithm.episode_metrics(counts)["episode/dropped_groups"] == 1.0
