"""The weighted sum of several reward sources, each source's metrics, and the errors of building them."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_config
from trainer.errors import ConfigError
from trainer.rewards.weighted import build_weighted_scorer, reward_metrics

PROMPTS, RESPONSES, ANSWERS = ["1+2=", "3+4=", "2+2="], ["3", "8", "four"], ["3", "7", "4"]
BATCH = {"input_ids": torch.zeros(3, 4, dtype=torch.long)}


def config_with(tmp_path, tiny_model, task_files, sources):
    return make_config("grpo", tmp_path, tiny_model, task_files["prompts"], reward={"sources": sources})


def test_score_is_the_weighted_sum_and_each_source_is_logged(tmp_path, tiny_model, task_files):
    config = config_with(tmp_path, tiny_model, task_files, [
        {"kind": "function", "name": "tiny_addition", "weight": 1.0},  # 1, 0, 0
        {"kind": "format", "pattern": r"\d+", "weight": 0.5},  # 1, 1, 0
        {"kind": "math", "weight": -0.25},  # 1, 0, 0 (a negative weight penalises)
        {"kind": "exact_match", "name": "watched", "weight": 0.0},  # 1, 0, 0: logged, not summed
    ])
    scorer = build_weighted_scorer(config, torch.device("cpu"))
    scores = scorer(BATCH, PROMPTS, RESPONSES, ANSWERS)
    assert scores.tolist() == pytest.approx([1 + 0.5 - 0.25, 0.5, 0.0])
    metrics = reward_metrics(scorer)
    assert metrics["rewards/tiny_addition/mean"] == pytest.approx(1 / 3)
    assert metrics["rewards/tiny_addition/std"] == pytest.approx(torch.tensor([1.0, 0, 0]).std(unbiased=False).item())
    assert metrics["rewards/format/mean"] == pytest.approx(2 / 3)
    assert metrics["rewards/math/mean"] == pytest.approx(1 / 3)
    assert metrics["rewards/watched/mean"] == pytest.approx(1 / 3)


def test_the_older_function_form_scores_as_before(tmp_path, tiny_model, task_files):
    config = make_config("grpo", tmp_path, tiny_model, task_files["prompts"], reward={"function": "tiny_addition"})
    scorer = build_weighted_scorer(config, torch.device("cpu"))
    assert scorer(BATCH, PROMPTS, RESPONSES, ANSWERS).tolist() == [1.0, 0.0, 0.0]
    assert set(reward_metrics(scorer)) == {"rewards/tiny_addition/mean", "rewards/tiny_addition/std"}


def test_unknown_function_name_names_its_source(tmp_path, tiny_model, task_files):
    config = config_with(tmp_path, tiny_model, task_files, [{"kind": "math"},
                                                            {"kind": "function", "name": "os:system"}])
    with pytest.raises(ConfigError, match=r"^reward.sources.1.name is 'os:system', which is not an allowed reward "
                                          r"function; allowed: tiny_addition"):
        build_weighted_scorer(config, torch.device("cpu"))
    legacy = make_config("grpo", tmp_path, tiny_model, task_files["prompts"], reward={"function": "nope"})
    with pytest.raises(ConfigError, match=r"^reward.function is 'nope'"):
        build_weighted_scorer(legacy, torch.device("cpu"))


def test_a_reward_model_source_without_a_trained_head_is_refused(tmp_path, tiny_model, task_files):
    config = config_with(tmp_path, tiny_model, task_files, [{"kind": "model", "path": str(tiny_model)}])
    with pytest.raises(ConfigError, match=r"reward.sources.0.path"):
        build_weighted_scorer(config, torch.device("cpu"))
