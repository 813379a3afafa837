"""Tests of the colocated loop's pieces that the seed's `OLTrainer` options reach: `sample_buffer`
(one sampled minibatch per update step) and `dataloader_pin_memory` (pinned copies to CUDA)."""

import pytest
import torch

from tests.conftest import make_config
from tests.trainer.asynchronous.test_buffer import make_experience
from trainer.lifecycle.context import build_context
from trainer.online.batches import to_device
from trainer.online.stages import build_online_trainer


def test_pin_memory_is_a_plain_copy_off_cuda():
    experience = make_experience(1)
    moved = to_device(experience, torch.device("cpu"), pin_memory=True)
    assert torch.equal(moved.input_ids, experience.input_ids) and not moved.input_ids.is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pin_memory_copies_cpu_batches_to_cuda():
    experience = make_experience(1)
    moved = to_device(experience, torch.device("cuda"), pin_memory=True)
    torch.cuda.synchronize()
    assert moved.input_ids.is_cuda and torch.equal(moved.input_ids.cpu(), experience.input_ids)


@pytest.mark.parametrize(("sample_buffer", "expected_steps"), [(False, 3 * 2), (True, 3)])
def test_sample_buffer_trains_one_sampled_minibatch_per_update_step(sample_buffer, expected_steps, tmp_path,
                                                                     tiny_model, task_files):
    # 2 collect steps of 2 prompts x 2 generations = 8 rows; minibatches of 4: two optimizer steps per update step,
    # or one minibatch sampled from the buffer per update step with `sample_buffer`.
    config = make_config("grpo", tmp_path / "run", tiny_model, task_files["prompts"], train={"micro_batch_size": 4},
                         generation={"max_new_tokens": 2}, reward={"function": "trainer.tiny.task:reward"},
                         grpo={"num_episodes": 1, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})
    trainer = build_online_trainer(config, build_context(config))
    trainer.sample_buffer = sample_buffer
    trainer.fit(num_episodes=1, num_collect_steps=2, num_update_steps=3)
    assert trainer.global_step == expected_steps


class RecordingTracker:
    def __init__(self):
        self.logged: list[tuple[dict, int]] = []

    def log_metrics(self, metrics, step):
        self.logged.append((dict(metrics), step))


@pytest.mark.parametrize(("stage", "timed", "untimed"), [
    # PPO with a KL term: the critic's values, the old and reference log-probs all run.
    ("ppo", {"generate", "score", "values", "logps_old", "logps_ref", "update"}, set()),
    # GRPO without a KL term and one optimizer step per episode: no critic, no reference, no old log-probs.
    ("grpo", {"generate", "score", "update"}, {"values", "logps_old", "logps_ref"}),
])
def test_each_episode_logs_where_its_time_went(stage, timed, untimed, tmp_path, tiny_model, task_files):
    options = {"num_episodes": 2, "rollout_batch_size": 4, "mini_batch_size": 8}
    options |= {"num_generations": 2, "beta": 0.0} if stage == "grpo" else {"rollout_batch_size": 8, "kl_coef": 0.05}
    config = make_config(stage, tmp_path / stage, tiny_model, task_files["prompts"], train={"micro_batch_size": 8},
                         generation={"max_new_tokens": 4}, reward={"function": "trainer.tiny.task:reward"},
                         **{stage: options})
    trainer = build_online_trainer(config, build_context(config))
    trainer.tracker = RecordingTracker()
    trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1)
    perf = [(metrics, step) for metrics, step in trainer.tracker.logged if "perf/time/step" in metrics]
    episodes = [metrics for metrics, _ in trainer.tracker.logged if "episode/response_length" in metrics]
    assert [step for _, step in perf] == [1, 2]  # one breakdown per episode, at its last optimizer step
    for (metrics, _), episode in zip(perf, episodes):
        assert all(metrics[f"perf/time/{name}"] > 0 for name in timed)
        assert all(metrics[f"perf/time/{name}"] == 0 for name in untimed)
        phases = sum(value for key, value in metrics.items() if key.startswith("perf/time/") and key != "perf/time/step")
        assert phases <= metrics["perf/time/step"]
        tokens = episode["episode/response_length"] * 8  # 8 responses an episode
        assert metrics["perf/tokens_per_second"] == pytest.approx(tokens / metrics["perf/time/step"])
        assert metrics["perf/completions_per_second"] == pytest.approx(8 / metrics["perf/time/step"])
