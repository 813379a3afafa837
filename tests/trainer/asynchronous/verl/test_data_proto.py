"""Tests of `trainer.asynchronous.verl.data_proto`: experiences to one batch, and the batch metrics."""

import pytest
import torch

from tests.trainer.asynchronous.test_buffer import make_experience
from trainer.asynchronous.verl.data_proto import compute_data_metrics, to_data_proto


def test_to_data_proto_pads_concatenates_and_records_each_rows_version():
    short, long = make_experience(1, batch_size=2, length=3, version=4), make_experience(2, batch_size=1, length=5, version=6)
    data = to_data_proto([short, long], pad_token_id=0)
    assert data.batch.input_ids.shape == (3, 5)
    assert data.batch.input_ids[0].tolist() == [10, 11, 12, 0, 0]  # right-padded with the pad id
    assert data.meta_info["model_versions"].tolist() == [4, 4, 6]
    assert data.meta_info["global_token_num"] == 2 * 3 + 5
    assert data.batch.version == 4  # the oldest


def test_union_adds_worker_outputs_by_field_name():
    data = to_data_proto([make_experience(1)], pad_token_id=0)
    updated = data.union({"old_logps": torch.full((2, 3), -1.0)})
    assert updated.batch.old_logps.sum() == -6 and data.batch.old_logps is None


def test_compute_data_metrics_matches_hand_values():
    # Two rows of 4 tokens: row 0 has a 1-token prompt and 3 response tokens, row 1 a 2-token
    # prompt and 2 response tokens.
    data = to_data_proto([make_experience(1, batch_size=2, length=4)], pad_token_id=0)
    batch = data.batch
    batch.action_mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    batch.scores = torch.tensor([1.0, -1.0])
    batch.advantages = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 9.0, -1.0, 0.0]])  # 9s are outside the response
    batch.rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0], [0.0, 0.0, 0.0, -1.0]])
    metrics = compute_data_metrics(data, max_response_length=3)
    assert metrics["critic/score/mean"] == 0 and metrics["critic/score/max"] == 1 and metrics["critic/score/min"] == -1
    assert metrics["critic/rewards/mean"] == pytest.approx((1.5 - 1.0) / 2)
    assert metrics["critic/advantages/mean"] == pytest.approx((1 + 2 + 3 - 1 + 0) / 5)
    assert metrics["critic/advantages/max"] == 3 and metrics["critic/advantages/min"] == -1
    assert metrics["response_length/mean"] == 2.5 and metrics["response_length/clip_ratio"] == 0.5
    assert metrics["prompt_length/max"] == 2 and metrics["prompt_length/min"] == 1
    assert "critic/values/mean" not in metrics and "critic/returns/mean" not in metrics  # GRPO has neither
