"""The gate's paired statistics: bounds worked out by hand, the guards, and how often noise gets through."""

from __future__ import annotations

import random

import pytest

from trainer.online.paired_gate import GateDecision, Guard, compare_paired


def test_exact_bound_of_a_01_reward_is_clopper_pearson_on_the_prompts_the_models_split():
    # 20 prompts: the candidate is right on 6 the baseline got wrong and loses none. The one-sided 95%
    # Clopper-Pearson bound of 6 successes in 6 is 0.05 ** (1 / 6) = 0.6070, so the difference (m / n)(2q - 1)
    # is at least 6/20 * (2 * 0.6070 - 1) = 0.0642.
    candidate, baseline = [1.0] * 6 + [0.0] * 14, [0.0] * 20
    comparison = compare_paired(candidate, baseline, confidence=0.95, metric="reward")
    assert comparison.method == "exact" and (comparison.wins, comparison.losses, comparison.n) == (6, 0, 20)
    assert comparison.difference == pytest.approx(0.30)
    assert comparison.lower_bound == pytest.approx(6 / 20 * (2 * 0.05 ** (1 / 6) - 1), rel=1e-9)


def test_prompts_both_models_get_right_or_wrong_carry_no_evidence():
    # Both right on 5, both wrong on 5: no prompt is split, so there is no difference, with certainty.
    same = compare_paired([1.0] * 5 + [0.0] * 5, [1.0] * 5 + [0.0] * 5, confidence=0.95)
    assert (same.difference, same.lower_bound) == (0.0, 0.0)
    # One win and one loss on top of 18 ties: a difference of 0 whose bound is well below it.
    split = compare_paired([1.0, 0.0] + [1.0] * 18, [0.0, 1.0] + [1.0] * 18, confidence=0.95)
    assert split.difference == 0.0 and split.lower_bound < -0.08


def test_other_scores_are_bootstrapped_and_a_constant_difference_is_its_own_bound():
    # A reward model's scores: every prompt up by exactly 0.5, so every resample's mean is 0.5.
    constant = compare_paired([1.5, 2.5, -0.5, 3.0], [1.0, 2.0, -1.0, 2.5], confidence=0.95)
    assert constant.method == "bootstrap" and constant.lower_bound == pytest.approx(0.5)
    # 400 prompts, differences drawn around +0.2 with sd 1: the bound sits near mean - 1.645 sd / sqrt(n).
    rng = random.Random(0)
    differences = [rng.gauss(0.2, 1.0) for _ in range(400)]
    comparison = compare_paired(differences, [0.0] * 400, confidence=0.95)
    mean = sum(differences) / 400
    sd = (sum((d - mean) ** 2 for d in differences) / 399) ** 0.5
    assert comparison.lower_bound == pytest.approx(mean - 1.645 * sd / 400 ** 0.5, abs=0.01)


def test_lower_is_better_compares_the_reference_minus_the_candidate():
    longer = compare_paired([4.0, 5.0, 6.0], [2.0, 3.0, 4.0], confidence=0.95, metric="response_tokens",
                            lower_is_better=True)
    assert longer.difference == pytest.approx(-2.0) and (longer.wins, longer.losses) == (0, 3)


def test_unequal_or_empty_score_lists_are_refused_with_the_metric_named():
    with pytest.raises(ValueError, match="reward: expected two equal, non-empty lists"):
        compare_paired([1.0, 0.0], [1.0], confidence=0.95, metric="reward")
    with pytest.raises(ValueError, match="reward"):
        compare_paired([], [], confidence=0.95, metric="reward")


def test_the_gate_opens_on_a_confident_gain_and_a_guard_that_falls_refuses_it():
    primary = compare_paired([1.0] * 30 + [0.0] * 70, [1.0] * 10 + [0.0] * 90, confidence=0.95, metric="rm_score")
    holding = Guard(compare_paired([1.0] * 50, [1.0] * 50, confidence=0.95, metric="reward"), tolerance=0.05)
    falling = Guard(compare_paired([0.0] * 20 + [1.0] * 30, [1.0] * 50, confidence=0.95, metric="reward"),
                    tolerance=0.05)
    opens = GateDecision(reference="baseline", primary=primary, min_effect=0.05, confidence=0.95, guards=(holding,))
    assert opens.opens and opens.reason.startswith("opens against the baseline: rm_score +0.200")
    refused = GateDecision(reference="baseline", primary=primary, min_effect=0.05, confidence=0.95, guards=(falling,))
    assert not refused.opens and "by the guard reward -0.400" in refused.reason
    numbers = refused.metrics()
    assert numbers["gate/opens"] == 0.0 and numbers["gate/guard/reward/holds"] == 0.0
    assert numbers["gate/lower_bound"] == pytest.approx(primary.lower_bound)
    too_small = GateDecision(reference="champion", primary=primary, min_effect=0.3, confidence=0.95)
    assert not too_small.opens and too_small.reason.startswith("refused against the champion: rm_score")
    assert too_small.metrics()["champion_gate/min_effect"] == 0.3


def test_noise_gets_through_about_as_often_as_the_confidence_allows_and_a_real_gain_nearly_always_does():
    """500 simulated evaluations on 100 held-out prompts: a candidate no better than its baseline (each prompt right
    with the same chance 0.4, independently) against one that is 0.2 better. The old gate (`improvement > 0`) let
    noise through about half the time."""
    rng = random.Random(1)

    def opened(gain: float) -> float:
        count = 0
        for _ in range(500):
            baseline = [float(rng.random() < 0.4) for _ in range(100)]
            candidate = [float(rng.random() < 0.4 + gain) for _ in range(100)]
            comparison = compare_paired(candidate, baseline, confidence=0.95)
            count += comparison.lower_bound >= 0.0
        return count / 500

    assert opened(0.0) <= 0.06  # 5% by construction; exact tests err on the safe side
    assert opened(0.2) >= 0.6
