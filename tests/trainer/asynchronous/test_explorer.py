"""Tests of the explorer (`trainer.asynchronous.explorer`) and its process entry (`launch.run_explorer`) on restarts
and failures: numbering continues, nothing is regenerated, a failure is marked FAILED (not CLOSED), and a
second explorer cannot write a live explorer's buffer. The tiny model generates; weights come from an
in-process `Synchronizer`."""

import subprocess
import sys

import pytest
import torch

from tests.conftest import make_config
from tests.trainer.asynchronous.test_buffer import assert_same_experience, batch_names, make_experience
from trainer.asynchronous.buffer import FileBuffer, QueueBuffer
from trainer.asynchronous.explorer import Explorer
from trainer.asynchronous.launch import run_explorer
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.errors import LeaseError, WaitTimeout
from trainer.lifecycle.lease import Lease


def explorer_config(tmp_path, tiny_model, task_files, **asynchronous):
    return make_config("grpo", tmp_path / "run", tiny_model, task_files["prompts"], train={"micro_batch_size": 8},
                       generation={"max_new_tokens": 3}, reward={"function": "trainer.tiny.task:reward"},
                       grpo={"rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4},
                       asynchronous={"total_steps": 4, "sync_interval": 1, "sync_offset": 1, "wait_timeout": 5}
                       | asynchronous)


def publish_own_weights(explorer: Explorer, version: int, synchronizer: Synchronizer) -> None:
    synchronizer.set_model_state_dict({k: v.clone() for k, v in explorer.policy.state_dict().items()}, version)


def test_a_restarted_explorer_continues_the_numbering_and_regenerates_nothing(tmp_path, tiny_model, task_files):
    config = explorer_config(tmp_path, tiny_model, task_files)
    directory = tmp_path / "buffer"
    earlier = FileBuffer(directory)  # what the explorer that died had written
    earlier.put(make_experience(1))
    earlier.put(make_experience(2))
    earlier.discard_through(1)  # batch 1 was trained on and checkpointed
    synchronizer = Synchronizer()
    explorer = Explorer(config, buffer=FileBuffer(directory), synchronizer=synchronizer)
    publish_own_weights(explorer, 3, synchronizer)  # the trainer is at step 3

    assert explorer.run() == 2  # batches 3 and 4 of total_steps 4

    assert batch_names(directory) == ["batch-00000002.safetensors", "batch-00000003.safetensors",
                                      "batch-00000004.safetensors"]
    reader = FileBuffer(directory)
    reader.seek(1)
    assert_same_experience(reader.get(1), make_experience(2))  # batch 2 is the earlier explorer's, untouched
    assert reader.get(1).version == 3 and reader.get(1).version == 3
    assert reader.is_closed() and reader.get(1) is None


def test_a_restarted_explorer_samples_the_prompts_an_uninterrupted_one_would(tmp_path, tiny_model, task_files):
    explorer = Explorer(explorer_config(tmp_path, tiny_model, task_files), buffer=QueueBuffer())
    per_epoch = len(explorer.rows) // explorer.batch_size
    explorer.seek(0)
    uninterrupted = [explorer.prompts.take(explorer.batch_size) for _ in range(per_epoch + 3)]  # past an epoch
    for done in (1, 7, per_epoch, per_epoch + 2):
        explorer.seek(done)
        assert explorer.prompts.take(explorer.batch_size) == uninterrupted[done], done


def test_the_explorer_follows_a_restarted_trainer_back_to_its_older_version(tmp_path, tiny_model, task_files):
    synchronizer = Synchronizer()
    explorer = Explorer(explorer_config(tmp_path, tiny_model, task_files), buffer=QueueBuffer(),
                        synchronizer=synchronizer)
    publish_own_weights(explorer, 5, synchronizer)
    explorer.refresh_weights(4)
    changed = {k: v + 1 for k, v in explorer.policy.state_dict().items()}
    synchronizer.set_model_state_dict(changed, 3)  # the trainer was restarted from its step-3 checkpoint
    explorer.refresh_weights(2)
    assert explorer.version == 3
    torch.testing.assert_close(explorer.policy.state_dict(), changed)


def test_a_failing_explorer_marks_the_buffer_failed_not_closed(tmp_path, tiny_model, task_files):
    config = explorer_config(tmp_path, tiny_model, task_files, wait_timeout=0.3)
    buffer = FileBuffer(tmp_path / "buffer")
    explorer = Explorer(config, buffer=buffer, synchronizer=Synchronizer())  # no trainer publishes weights

    with pytest.raises(WaitTimeout):
        explorer.run()

    assert not buffer.is_closed()
    assert buffer.failure().startswith("WaitTimeout: in-process synchronizer: weight version 0 not uploaded")
    assert "\n" not in buffer.failure()


def test_a_second_explorer_on_a_live_explorers_buffer_fails_at_once_naming_it(tmp_path, tiny_model, task_files):
    config = explorer_config(tmp_path, tiny_model, task_files, wait_timeout=30)
    directory = tmp_path / "run" / "buffer"
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the live explorer's process
    held = Lease(str(directory), 60)
    held.holder["pid"] = first.pid
    held.acquire()
    try:
        with pytest.raises(LeaseError, match=rf"lease.json: another explorer is writing {directory} .*pid {first.pid}"):
            run_explorer(config)
        assert FileBuffer(directory).failure() is None  # the live explorer's run is not marked failed
    finally:
        held.release()
        first.kill()
        first.wait()
