"""A diverging online run: non-finite steps are counted against `train.max_nonfinite_steps`, the run fails
with one line and a non-zero status, and no model is exported (issue 12)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import stage_dict
from tests.integration.trainer_process import error_lines, write_config
from trainer.__main__ import main


@pytest.fixture(autouse=True)
def allow_test_rewards(monkeypatch):
    # `length` scores the response's text length: responses differ, so advantages are not 0 and steps happen.
    monkeypatch.setenv("ALIGNFLOW_ALLOWED_REWARD_MODULES", "tests.trainer.online")


def run(capsys, tmp_path, stage, config) -> tuple[int, list[str]]:
    path = write_config(tmp_path / f"{stage}.yaml", config)
    capsys.readouterr()
    code = main([stage, "--config", str(path)])
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    return code, error_lines(stderr)


def test_ppo_with_a_diverging_critic_fails_after_max_nonfinite_steps_in_a_row(capsys, tmp_path, tiny_model, task_files):
    # critic_lr 1e10: the first step blows the critic up; from then on values, advantages and both losses are NaN.
    config = stage_dict("ppo", tmp_path / "out", tiny_model, task_files["prompts"],
                        train={"micro_batch_size": 4, "max_nonfinite_steps": 1, "log_interval": 1},
                        generation={"max_new_tokens": 6}, reward={"function": "tests.trainer.online.rewards:length"},
                        ppo={"num_episodes": 8, "rollout_batch_size": 4, "mini_batch_size": 4, "critic_lr": 1e10})
    code, lines = run(capsys, tmp_path, "ppo", config)
    assert code == 2
    assert lines == ["TrainingError: step 3: 2 optimizer steps in a row had a non-finite loss or gradient norm "
                     "(train.max_nonfinite_steps is 1); the run diverged and is stopped without exporting: lower "
                     "optimizer.lr or check the data"]
    assert not (tmp_path / "out" / "model").exists()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]  # valid JSON
    steps = [row for row in rows if "nonfinite" in row]
    assert [row["train/nonfinite_skipped"] for row in steps] == [0.0, 1.0]  # step 3 raised before it was logged
    assert [row["critic/nonfinite_skipped"] for row in steps] == [0.0, 1.0]


def test_a_run_that_ends_inside_a_streak_of_skipped_steps_is_not_exported(capsys, tmp_path, tiny_model, task_files):
    config = stage_dict("ppo", tmp_path / "out", tiny_model, task_files["prompts"],
                        train={"micro_batch_size": 4, "max_nonfinite_steps": 5},
                        generation={"max_new_tokens": 6}, reward={"function": "tests.trainer.online.rewards:length"},
                        ppo={"num_episodes": 3, "rollout_batch_size": 4, "mini_batch_size": 4, "critic_lr": 1e10})
    code, lines = run(capsys, tmp_path, "ppo", config)
    assert code == 2
    assert lines == ["TrainingError: the run ended at step 3 after 2 optimizer step(s) in a row with a non-finite "
                     "loss or gradient norm; its model is not exported: lower optimizer.lr or check the data"]
    assert not (tmp_path / "out" / "model").exists()


def test_grpo_with_a_huge_learning_rate_fails_with_one_line_and_exports_nothing(capsys, tmp_path, tiny_model,
                                                                               task_files):
    # lr 1e10: the first step leaves weights of about 1e10, so the next rollout's probabilities are NaN. Sampling
    # cannot go on from there (the weights do not change until a step succeeds), so that is the run's one line.
    config = stage_dict("grpo", tmp_path / "out", tiny_model, task_files["prompts"], optimizer={"lr": 1e10},
                        train={"micro_batch_size": 4, "max_nonfinite_steps": 2}, generation={"max_new_tokens": 6},
                        reward={"function": "tests.trainer.online.rewards:length"},
                        grpo={"num_episodes": 8, "rollout_batch_size": 2, "mini_batch_size": 4, "num_generations": 2,
                              "beta": 0.0})
    code, lines = run(capsys, tmp_path, "grpo", config)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("TrainingError: ") and "diverged" in lines[0], lines
    assert not (tmp_path / "out" / "model").exists()
