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
