"""Rollout-correction weights against hand-computed values for each of TRL's four modes."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.ppo import truncated_importance_weights
from trainer.algorithms.rollout_correction import importance_weights

# Row 0: two response tokens, log pi - log pi_b = +0.5 and -1.0 (ratios e^0.5 = 1.6487, e^-1 = 0.3679), then padding.
# Row 1: one response token that agrees exactly (ratio 1).
TARGET = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.3, 0.0, 0.0]])
BEHAVIOUR = torch.tensor([[0.0, -1.5, -1.0, 0.0], [0.0, -0.3, 0.0, 0.0]])
MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
UP, DOWN = math.exp(0.5), math.exp(-1.0)


def weights_of(mode, **bounds):
    return importance_weights(TARGET, BEHAVIOUR, MASK, mode=mode, **bounds)


def test_token_truncate_clips_each_ratio_at_the_cap():
    weights, stats = weights_of("token_truncate", clip_max=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1, 1.5, DOWN, 1], [1, 1, 1, 1]]))
    assert stats["clipped_fraction"].item() == pytest.approx(1 / 3)  # one of three response tokens
    assert stats["ratio_min"].item() == pytest.approx(DOWN) and stats["ratio_max"].item() == pytest.approx(UP)
    # k1 of KL(pi_b || pi): mean of log pi_b - log pi over response tokens = (-0.5 + 1.0 + 0) / 3
    assert stats["kl"].item() == pytest.approx(0.5 / 3)
    assert stats["weight_mean"].item() == pytest.approx((1.5 + DOWN + 1) / 3)


def test_token_mask_zeroes_ratios_outside_the_bounds():
    weights, stats = weights_of("token_mask", clip_max=1.5, clip_min=0.5)
    torch.testing.assert_close(weights, torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1.0]]))  # both of row 0 are out
    assert stats["clipped_fraction"].item() == pytest.approx(2 / 3)


def test_sequence_modes_share_one_ratio_per_response():
    # Row 0: exp(0.5 - 1.0) = e^-0.5 = 0.6065 for both tokens; row 1: exp(0) = 1.
    weights, stats = weights_of("sequence_truncate", clip_max=3.0, clip_min=0.7)
    torch.testing.assert_close(weights, torch.tensor([[1, 0.7, 0.7, 1], [1, 1, 1, 1.0]]))
    assert stats["clipped_fraction"].item() == pytest.approx(1 / 2)  # one of two responses
    assert stats["ratio_min"].item() == pytest.approx(math.exp(-0.5))
    weights, _ = weights_of("sequence_mask", clip_max=3.0, clip_min=0.7)
    torch.testing.assert_close(weights, torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1.0]]))
    weights, stats = weights_of("sequence_mask", clip_max=3.0)  # TRL's default: no lower bound
    torch.testing.assert_close(weights[0, 1:3], torch.full((2,), math.exp(-0.5)))
    assert stats["clipped_fraction"].item() == 0.0


def test_agreeing_policies_give_weight_one_everywhere():
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        weights, stats = importance_weights(TARGET, TARGET.clone(), MASK, mode=mode, clip_max=3.0)
        assert torch.equal(weights, torch.ones_like(weights)), mode
        assert stats["kl"].item() == 0.0 and stats["clipped_fraction"].item() == 0.0


def test_token_truncate_is_the_staleness_weight_of_the_asynchronous_mode():
    weights, _ = weights_of("token_truncate", clip_max=2.0)
    reference = truncated_importance_weights(TARGET, BEHAVIOUR, cap=2.0)
    torch.testing.assert_close(weights[MASK > 0], reference[MASK > 0])


def test_an_overflowing_ratio_is_bounded_not_inf():
    target, behaviour = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, -200.0]])
    weights, _ = importance_weights(target, behaviour, torch.tensor([[0, 1]]), mode="token_truncate", clip_max=3.0)
    assert weights[0, 1].item() == 3.0
    weights, _ = importance_weights(target, behaviour, torch.tensor([[0, 1]]), mode="sequence_mask", clip_max=3.0)
    assert weights[0, 1].item() == 0.0


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="token_truncate"):
        weights_of("tis", clip_max=2.0)
