"""Tests for `FunctionScorer`: every reward value is a finite number from a call that finished in time.

The functions live in `tests/trainer/online/rewards.py`; each failure names the function and the row.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trainer.errors import RewardError
from trainer.rewards.function_registry import read_reward_allow_list
from trainer.rewards.functions import FunctionScorer, load_reward_function

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "4x", "6"]
ANSWERS = ["2", "4", "6"]


def scorer(name: str, timeout: float = 5.0) -> FunctionScorer:
    allowed = read_reward_allow_list({"ALIGNFLOW_ALLOWED_REWARD_MODULES": "tests.trainer.online.rewards"})
    return FunctionScorer(load_reward_function(f"tests.trainer.online.rewards:{name}", allowed), timeout)


def score(name: str, timeout: float = 5.0) -> list[float]:
    return scorer(name, timeout).score(PROMPTS, COMPLETIONS, ANSWERS)


def test_scores_are_floats_in_row_order_as_a_tensor_on_the_batch_device():
    batch = {"input_ids": torch.zeros(3, 2, dtype=torch.long)}
    scores = scorer("length")(batch, PROMPTS, COMPLETIONS, ANSWERS)
    assert scores.dtype == torch.float32 and scores.tolist() == [1.0, 2.0, 1.0]


def test_numpy_scalars_and_one_element_tensors_count_as_numbers():
    assert score("returns_array_scalars") == [0.5, 2.0, 2.0]


def test_batched_function_is_called_once_with_the_columns():
    assert score("batched_length") == [2.0, 2.0, 2.0]  # len + 1 where the completion is the answer


def test_function_that_raises_fails_with_one_line_naming_function_and_row():
    with pytest.raises(RewardError) as raised:
        score("raises_on_second_row")
    assert str(raised.value) == ("reward function tests.trainer.online.rewards:raises_on_second_row on row 1 "
                                 "(prompt '2+2=') raised ValueError: cannot score this")
    assert isinstance(raised.value.__cause__, ValueError)


def test_function_past_the_timeout_fails_promptly_without_waiting_for_it():
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"sleeps on row 0 \(prompt '1\+1='\) ran past reward.timeout_seconds \(0.2 s\)"):
        score("sleeps", timeout=0.2)
    assert time.monotonic() - start < 1.5
    worker = [t for t in threading.enumerate() if t.name.startswith("reward-")]
    assert all(t.daemon for t in worker)  # an abandoned call cannot keep the process alive


@pytest.mark.parametrize(("name", "found"), [("returns_nan", "row 1 (prompt '2+2=') returned nan"),
                                             ("returns_text", "row 0 (prompt '1+1=') returned str")])
def test_non_finite_or_non_numeric_values_fail_naming_the_row(name, found):
    with pytest.raises(RewardError) as raised:
        score(name)
    assert str(raised.value) == f"reward function tests.trainer.online.rewards:{name} on {found}, expected a finite number"


def test_batched_function_returning_the_wrong_count_fails():
    with pytest.raises(RewardError, match=r"batched_too_few \(batched\) returned 2 values for 3 rows"):
        score("batched_too_few")
