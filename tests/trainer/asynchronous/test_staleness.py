"""Tests of `trainer.asynchronous.staleness`: how old a batch is, when it is rejected, and its importance weights.

Inputs are built by hand; every expected value is worked out in the comments.
"""

import math

import pytest
import torch

from tests.trainer.asynchronous.test_buffer import make_experience
from trainer.asynchronous.staleness import importance_correction, is_too_stale, staleness_metrics
from trainer.config import AsynchronousConfig


def test_a_batch_beyond_max_staleness_is_too_stale_and_one_at_the_limit_is_not():
    batch = make_experience(1, version=3)
    assert not is_too_stale(batch, current_version=5, max_staleness=2)  # 5 - 3 = 2: at the limit
    assert is_too_stale(batch, current_version=6, max_staleness=2)  # 3 versions old
    assert not is_too_stale(batch, current_version=2, max_staleness=0)  # from a newer policy (a rollback): kept


def test_staleness_metrics_are_over_the_rows():
    metrics = staleness_metrics(7, torch.tensor([7, 5, 4]))  # 0, 2 and 3 versions old
    assert metrics == {"staleness/mean": pytest.approx(5 / 3), "staleness/max": 3.0}


def test_importance_correction_weights_response_tokens_and_reports_them():
    # One row, prompt token then three response tokens. pi_old / pi_behav per response token:
    # 0.6 / 0.3 = 2 (over the cap 1.5: truncated), 0.4 / 0.4 = 1, 0.2 / 0.8 = 0.25.
    batch = make_experience(1, batch_size=1, length=4)
    batch.old_logps = torch.tensor([[0.0, math.log(0.6), math.log(0.4), math.log(0.2)]])
    batch.behaviour_logps = torch.tensor([[0.0, math.log(0.3), math.log(0.4), math.log(0.8)]])
    tensors, metrics = importance_correction(batch, cap=1.5)
    torch.testing.assert_close(tensors["importance_weights"], torch.tensor([[1.0, 1.5, 1.0, 0.25]]))
    assert metrics["staleness/importance_weight"] == pytest.approx((1.5 + 1.0 + 0.25) / 3)
    assert metrics["staleness/truncated_fraction"] == pytest.approx(1 / 3)
    # k1 of KL(pi_behav || pi_old) per token: mean of log(0.3/0.6), log(1), log(0.8/0.2).
    assert metrics["staleness/behaviour_kl"] == pytest.approx((math.log(0.5) + 0 + math.log(4)) / 3)


def test_no_correction_without_behaviour_log_probs():
    batch = make_experience(1)
    batch.old_logps = torch.zeros(2, 3)
    assert importance_correction(batch, cap=2.0) == ({}, {})


def test_default_staleness_limit_is_what_the_explorer_protocol_produces():
    assert AsynchronousConfig(sync_interval=2, sync_offset=1).staleness_limit == 2
    assert AsynchronousConfig(sync_interval=2, sync_offset=1, max_staleness=5).staleness_limit == 5


def test_a_max_staleness_below_what_the_explorer_produces_is_a_config_error():
    with pytest.raises(ValueError, match="max_staleness is 1 but sync_offset 1 and sync_interval 2"):
        AsynchronousConfig(sync_interval=2, sync_offset=1, max_staleness=1)
