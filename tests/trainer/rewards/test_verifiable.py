"""The built-in verifiable rewards on small GSM8K- and MATH-style rows written here."""

from __future__ import annotations

import re

import pytest
import torch

from trainer.rewards.verifiable import build_verifiable_scorer, exact_match, format_match, math_equivalence

# (response, reference answer, expected reward): each row says why.
MATH_ROWS = [
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),  # GSM8K's final-answer line
    ("She has 71 clips left, so the answer is 71.", "72", 0.0),  # a wrong number
    (r"Adding the parts gives $\boxed{\frac{3}{4}}$.", "3/4", 1.0),  # a boxed LaTeX fraction vs a plain one
    (r"So $x = \boxed{0.5}$", r"\frac{1}{2}", 1.0),  # a decimal vs bare LaTeX in the answer column
    (r"The length is $\boxed{2\sqrt{2}}$.", r"\sqrt{8}", 1.0),  # equal after simplification
    (r"The length is $\boxed{2\sqrt{3}}$.", r"\sqrt{8}", 0.0),  # not equal
    ("I cannot solve this.", "5", 0.0),  # no answer at all
    ("The answer is 5.", None, 0.0),  # a row without a reference scores 0
]


@pytest.mark.parametrize(("response", "answer", "expected"), MATH_ROWS)
def test_math_equivalence_checks_the_final_answer(response, answer, expected):
    assert math_equivalence(response, answer) == expected


def test_exact_match_normalised_and_strict():
    assert exact_match("  The Answer  is 7. ", "the answer is 7") == 1.0  # case, spaces, final period
    assert exact_match("The Answer is 7", "the answer is 7", normalize=False) == 0.0
    assert exact_match("7", "7", normalize=False) == 1.0
    assert exact_match("8", "7") == 0.0
    assert exact_match("7", None) == 0.0


def test_format_reward_needs_the_whole_response_to_match():
    pattern = re.compile(r"<think>.*</think>\s*<answer>.*</answer>", re.DOTALL)
    assert format_match("<think>3+4\nis 7</think> <answer>7</answer>", pattern) == 1.0
    assert format_match("<answer>7</answer>", pattern) == 0.0  # no reasoning block
    assert format_match("<think>x</think><answer>7</answer> and more", pattern) == 0.0  # trailing text


def test_scorers_return_one_score_per_row_on_the_batch_device():
    batch = {"input_ids": torch.zeros(3, 2, dtype=torch.long)}
    scorer = build_verifiable_scorer("math")
    scores = scorer(batch, ["q1", "q2", "q3"], [r"\boxed{4}", "4", "five"], ["4", "2+2", "5"])
    assert scores.tolist() == [1.0, 1.0, 0.0]
    assert build_verifiable_scorer("format", pattern=r"\d+")(batch, ["a"] * 3, ["12", "1 2", ""], [None] * 3).tolist() \
        == [1.0, 0.0, 0.0]
