"""Tests for the experience buffers (`trainer.asynchronous.buffer`), weight publishing (`trainer.asynchronous.weights`) and
`Experience` batching (`trainer.rollout.experience`).

Two `FileBuffer` objects on one directory stand in for the explorer and trainer processes; a new
object on the same directory stands in for a restarted one. Every wait uses a timeout of 0.2 s,
so a hang shows as a slow failure rather than a stuck run.
"""

import threading
import time

import pytest
import torch

from trainer.asynchronous.buffer import (
    CLOSED_MARKER,
    DISCARDED_FILE,
    FAILED_MARKER,
    ExplorerError,
    FileBuffer,
    QueueBuffer,
)
from trainer.asynchronous.weights import latest_version, load_version, publish_weights, wait_for_version
from trainer.errors import AlignflowError, DataError, WaitTimeout
from trainer.rollout.experience import Experience, ReplayBuffer, concat_experiences

TIMEOUT = 0.2


def make_experience(seed: int, batch_size: int = 2, length: int = 3, version: int = 0) -> Experience:
    """A small batch whose token ids start at 10 * seed, so batches are told apart by their ids."""
    input_ids = torch.arange(batch_size * length).reshape(batch_size, length) + 10 * seed  # (B, T)
    return Experience(
        input_ids=input_ids,
        attention_mask=torch.ones(batch_size, length, dtype=torch.long),
        action_mask=torch.tensor([[0] + [1] * (length - 1)] * batch_size),
        position_ids=torch.arange(length).repeat(batch_size, 1),
        scores=torch.arange(batch_size, dtype=torch.float32) + seed,  # (B,)
        version=version,
    )


def assert_same_experience(actual: Experience, expected: Experience) -> None:
    assert actual.as_batch().keys() == expected.as_batch().keys()
    for name, tensor in expected.as_batch().items():
        torch.testing.assert_close(getattr(actual, name), tensor, msg=name)
    assert actual.version == expected.version


def assert_times_out_quickly(get) -> None:
    start = time.monotonic()
    with pytest.raises(WaitTimeout):
        get(TIMEOUT)
    elapsed = time.monotonic() - start
    assert TIMEOUT <= elapsed < TIMEOUT + 1.5, elapsed


# ---- FileBuffer --------------------------------------------------------------------------------


def batch_names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("batch-"))


def test_file_buffer_round_trips_experiences_in_order(tmp_path):
    buffer = FileBuffer(tmp_path, poll_interval=0.01)
    first, second = make_experience(1, version=3), make_experience(2, version=4)
    assert buffer.put(first) == 1 and buffer.put(second) == 2  # numbered from 1
    assert_same_experience(buffer.get(TIMEOUT), first)
    assert buffer.position == 1
    assert_same_experience(buffer.get(TIMEOUT), second)
    assert buffer.position == 2


def test_file_buffer_keeps_read_batches_until_a_checkpoint_covers_them(tmp_path):
    writer, reader = FileBuffer(tmp_path), FileBuffer(tmp_path, poll_interval=0.01)
    for seed in (1, 2, 3):
        writer.put(make_experience(seed))
    reader.get(TIMEOUT)
    reader.get(TIMEOUT)
    # Read, but no checkpoint covers them yet: a trainer killed now must find them again.
    assert batch_names(tmp_path) == ["batch-00000001.safetensors", "batch-00000002.safetensors",
                                     "batch-00000003.safetensors"]
    reader.discard_through(1)  # a durable checkpoint records position 1
    assert batch_names(tmp_path) == ["batch-00000002.safetensors", "batch-00000003.safetensors"]
    assert reader.discarded_through() == 1
    reader.discard_through(0)  # never backwards
    assert reader.discarded_through() == 1


def test_file_buffer_reader_resumed_at_a_position_reads_the_batch_after_it(tmp_path):
    writer = FileBuffer(tmp_path)
    batches = [make_experience(seed) for seed in (1, 2, 3)]
    for batch in batches:
        writer.put(batch)
    resumed = FileBuffer(tmp_path, poll_interval=0.01)  # a restarted trainer whose checkpoint says position 1
    resumed.seek(1)
    assert_same_experience(resumed.get(TIMEOUT), batches[1])
    assert_same_experience(resumed.get(TIMEOUT), batches[2])
    assert resumed.position == 3


def test_file_buffer_resuming_behind_discarded_batches_is_an_error(tmp_path):
    buffer = FileBuffer(tmp_path)
    for seed in (1, 2, 3):
        buffer.put(make_experience(seed))
    buffer.discard_through(2)
    with pytest.raises(DataError, match=rf"{DISCARDED_FILE}: batches up to 2 were deleted .* resumes at batch 2"):
        FileBuffer(tmp_path).seek(1)
    FileBuffer(tmp_path).seek(2)  # at the discarded position itself: batch 3 is there


def test_file_buffer_numbering_continues_across_writer_restarts(tmp_path):
    FileBuffer(tmp_path).put(make_experience(1))
    FileBuffer(tmp_path).put(make_experience(2))  # a restarted explorer continues after batch 1
    assert batch_names(tmp_path) == ["batch-00000001.safetensors", "batch-00000002.safetensors"]
    FileBuffer(tmp_path).discard_through(2)  # everything consumed and checkpointed: no batch file is left
    restarted = FileBuffer(tmp_path)
    assert restarted.last_written() == 2
    assert restarted.put(make_experience(3)) == 3  # not 1: the discarded numbers are not reused
    assert batch_names(tmp_path) == ["batch-00000003.safetensors"]


def test_file_buffer_refuses_to_write_a_number_another_writer_took(tmp_path):
    first, second = FileBuffer(tmp_path), FileBuffer(tmp_path)
    first.put(make_experience(1))
    second.put(make_experience(2))  # batch 2
    with pytest.raises(DataError, match=r"batch-00000002.safetensors already exists: another explorer"):
        first.put(make_experience(3))  # first still believes 2 is free
    reader = FileBuffer(tmp_path)
    reader.seek(1)
    assert_same_experience(reader.get(TIMEOUT), make_experience(2))  # the second writer's batch 2 is intact


def test_file_buffer_get_on_an_empty_buffer_times_out(tmp_path):
    buffer = FileBuffer(tmp_path, poll_interval=0.01)
    assert_times_out_quickly(buffer.get)
    assert issubclass(WaitTimeout, AlignflowError)


def test_file_buffer_returns_none_once_closed_and_drained(tmp_path):
    buffer = FileBuffer(tmp_path, poll_interval=0.01)
    experience = make_experience(1)
    buffer.put(experience)
    buffer.close()
    assert buffer.is_closed()
    assert_same_experience(buffer.get(TIMEOUT), experience)  # unread batches still come first
    assert buffer.get(TIMEOUT) is None
    assert buffer.get(TIMEOUT) is None  # and it stays closed


def test_file_buffer_reader_sees_batches_put_after_it_was_created(tmp_path):
    reader = FileBuffer(tmp_path, poll_interval=0.01)  # the trainer starts first, on an empty directory
    writer = FileBuffer(tmp_path, poll_interval=0.01)
    first, second = make_experience(1), make_experience(2)
    writer.put(first)
    assert_same_experience(reader.get(TIMEOUT), first)
    writer.put(second)
    writer.close()
    assert_same_experience(reader.get(TIMEOUT), second)
    assert reader.get(TIMEOUT) is None


def test_file_buffer_reader_created_after_the_writer_starts_at_batch_1(tmp_path):
    writer = FileBuffer(tmp_path, poll_interval=0.01)
    first, second = make_experience(1), make_experience(2)
    writer.put(first)
    reader = FileBuffer(tmp_path, poll_interval=0.01)
    writer.put(second)
    assert_same_experience(reader.get(TIMEOUT), first)
    assert_same_experience(reader.get(TIMEOUT), second)


def test_file_buffer_get_waits_for_a_batch_from_another_thread(tmp_path):
    reader, writer = FileBuffer(tmp_path, poll_interval=0.01), FileBuffer(tmp_path, poll_interval=0.01)
    experience = make_experience(5)
    timer = threading.Timer(0.05, writer.put, args=(experience,))
    timer.start()
    try:
        assert_same_experience(reader.get(2.0), experience)
    finally:
        timer.join()


def test_file_buffer_does_not_drop_a_batch_put_just_before_close(tmp_path, monkeypatch):
    reader, writer = FileBuffer(tmp_path, poll_interval=0.01), FileBuffer(tmp_path, poll_interval=0.01)
    experience = make_experience(1)
    real_is_closed = reader.is_closed
    calls = []

    def producer_finishes_between_the_checks() -> bool:
        # The explorer's last put and its close land after the reader found no batch file, but
        # before it looks for the marker: the order two processes can produce.
        if not calls:
            writer.put(experience)
            writer.close()
        calls.append(1)
        return real_is_closed()

    monkeypatch.setattr(reader, "is_closed", producer_finishes_between_the_checks)
    got = reader.get(TIMEOUT)
    assert got is not None, "the last batch was lost"
    assert_same_experience(got, experience)


def test_file_buffer_put_leaves_no_temporary_files(tmp_path):
    buffer = FileBuffer(tmp_path)
    buffer.put(make_experience(1))
    buffer.put(make_experience(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch-00000001.safetensors", "batch-00000002.safetensors"]


def test_file_buffer_reset_drops_batches_and_the_closed_marker(tmp_path):
    buffer = FileBuffer(tmp_path, poll_interval=0.01)
    buffer.put(make_experience(1))
    buffer.put(make_experience(2))
    buffer.close()
    buffer.reset()
    assert list(tmp_path.iterdir()) == []
    assert not buffer.is_closed()
    assert_times_out_quickly(buffer.get)  # neither the old batches nor the marker are seen
    fresh = make_experience(3)
    buffer.put(fresh)  # numbering restarts at 1
    assert (tmp_path / "batch-00000001.safetensors").exists()
    assert_same_experience(buffer.get(TIMEOUT), fresh)


def test_file_buffer_closed_marker_name(tmp_path):
    FileBuffer(tmp_path).close()
    assert (tmp_path / CLOSED_MARKER).exists()


def test_file_buffer_failed_marker_stops_the_reader_after_the_batches_before_it(tmp_path):
    writer, reader = FileBuffer(tmp_path), FileBuffer(tmp_path, poll_interval=0.01)
    experience = make_experience(1)
    writer.put(experience)
    writer.fail("RewardError: reward function raised\n  ValueError: bad")
    assert (tmp_path / FAILED_MARKER).read_text() == "RewardError: reward function raised ValueError: bad"  # one line
    assert not reader.is_closed()  # failed is not closed
    assert_same_experience(reader.get(TIMEOUT), experience)  # what came before the failure is still read
    with pytest.raises(ExplorerError, match=rf"{FAILED_MARKER}: the explorer failed: RewardError: reward function"):
        reader.get(TIMEOUT)
    assert issubclass(ExplorerError, AlignflowError)


def test_file_buffer_clear_markers_keeps_batches_and_positions(tmp_path):
    buffer = FileBuffer(tmp_path, poll_interval=0.01)
    buffer.put(make_experience(1))
    buffer.put(make_experience(2))
    buffer.discard_through(1)
    buffer.close()
    buffer.fail("boom")
    buffer.clear_markers()
    assert not buffer.is_closed() and buffer.failure() is None
    assert batch_names(tmp_path) == ["batch-00000002.safetensors"] and buffer.discarded_through() == 1


# ---- QueueBuffer -------------------------------------------------------------------------------


def test_queue_buffer_round_trips_in_order():
    buffer = QueueBuffer()
    first, second = make_experience(1), make_experience(2)
    buffer.put(first)
    buffer.put(second)
    assert buffer.get(TIMEOUT) is first
    assert buffer.get(TIMEOUT) is second


def test_queue_buffer_get_on_an_empty_buffer_times_out():
    assert_times_out_quickly(QueueBuffer().get)


def test_queue_buffer_counts_positions_and_fails_after_what_came_before():
    buffer = QueueBuffer()
    buffer.seek(4)  # a resumed trainer
    assert buffer.last_written() == 4  # an explorer thread started now continues at 5
    assert buffer.put(make_experience(1)) == 5
    buffer.fail("WaitTimeout: no weights")
    assert buffer.get(TIMEOUT) is not None and buffer.position == 5
    for _ in range(2):  # and stays failed
        with pytest.raises(ExplorerError, match="the explorer failed: WaitTimeout: no weights"):
            buffer.get(TIMEOUT)


def test_queue_buffer_returns_none_once_closed_and_drained():
    buffer = QueueBuffer()
    experience = make_experience(1)
    buffer.put(experience)
    buffer.close()
    assert buffer.get(TIMEOUT) is experience
    assert buffer.get(TIMEOUT) is None
    assert buffer.get(TIMEOUT) is None  # stays closed for later readers


def test_queue_buffer_get_waits_for_a_put_from_another_thread():
    buffer = QueueBuffer()
    experience = make_experience(1)
    timer = threading.Timer(0.05, buffer.put, args=(experience,))
    timer.start()
    try:
        assert buffer.get(2.0) is experience
    finally:
        timer.join()


# ---- ReplayBuffer ------------------------------------------------------------------------------


def test_replay_buffer_appends_and_clears():
    buffer = ReplayBuffer()
    assert len(buffer) == 0
    first, second = make_experience(1), make_experience(2)
    buffer.append(first)
    buffer.append(second)
    assert len(buffer) == 2
    assert buffer.items == [first, second]
    buffer.clear()
    assert len(buffer) == 0 and buffer.items == []


# ---- weights -----------------------------------------------------------------------------------


def state_dict_for(version: int) -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.full((2, 2), float(version)), "layer.bias": torch.tensor([version, -version])}


def test_publish_then_load_round_trips_the_newest_version(tmp_path):
    assert latest_version(tmp_path) == -1  # nothing published yet
    publish_weights(tmp_path, state_dict_for(0), 0)
    publish_weights(tmp_path, state_dict_for(1), 1)
    assert latest_version(tmp_path) == 1
    version, state = load_version(tmp_path)
    assert version == 1
    assert state.keys() == {"layer.weight", "layer.bias"}
    for name, tensor in state_dict_for(1).items():
        torch.testing.assert_close(state[name], tensor)


def test_publish_keeps_only_the_newest_two_versions_and_no_temporary_files(tmp_path):
    for version in range(4):
        publish_weights(tmp_path, state_dict_for(version), version)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "version-00000002.safetensors", "version-00000003.safetensors"]


def test_wait_for_version_times_out_when_nothing_is_published(tmp_path):
    assert_times_out_quickly(lambda timeout: wait_for_version(tmp_path, 0, timeout, poll_interval=0.01))


def test_wait_for_version_returns_the_newest_version_at_or_above_the_minimum(tmp_path):
    publish_weights(tmp_path, state_dict_for(2), 2)
    publish_weights(tmp_path, state_dict_for(3), 3)
    assert wait_for_version(tmp_path, 1, TIMEOUT) == 3
    assert_times_out_quickly(lambda timeout: wait_for_version(tmp_path, 4, timeout, poll_interval=0.01))


def test_wait_for_version_sees_a_version_published_while_waiting(tmp_path):
    timer = threading.Timer(0.05, publish_weights, args=(tmp_path, state_dict_for(0), 0))
    timer.start()
    try:
        assert wait_for_version(tmp_path, 0, 2.0, poll_interval=0.01) == 0
    finally:
        timer.join()


# ---- Experience --------------------------------------------------------------------------------


def test_concat_experiences_right_pads_to_the_longest_sequence():
    short = make_experience(1, batch_size=2, length=3, version=5)
    short.old_logps = torch.tensor([[0.0, -1.0, -2.0], [0.0, -3.0, -4.0]])
    long = make_experience(2, batch_size=1, length=5, version=3)
    long.old_logps = torch.tensor([[0.0, -0.5, -0.5, -0.5, -0.5]])
    merged = concat_experiences([short, long], pad_token_id=7)
    assert len(merged) == 3
    # short's ids are 10..15 in two rows of 3; long's are 20..24. Padding: ids 7, everything else 0.
    torch.testing.assert_close(merged.input_ids, torch.tensor([[10, 11, 12, 7, 7], [13, 14, 15, 7, 7],
                                                               [20, 21, 22, 23, 24]]))
    torch.testing.assert_close(merged.attention_mask, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0],
                                                                    [1, 1, 1, 1, 1]]))
    torch.testing.assert_close(merged.action_mask, torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 0, 0],
                                                                 [0, 1, 1, 1, 1]]))
    torch.testing.assert_close(merged.position_ids, torch.tensor([[0, 1, 2, 0, 0], [0, 1, 2, 0, 0],
                                                                  [0, 1, 2, 3, 4]]))
    torch.testing.assert_close(merged.old_logps, torch.tensor([[0.0, -1.0, -2.0, 0.0, 0.0],
                                                               [0.0, -3.0, -4.0, 0.0, 0.0],
                                                               [0.0, -0.5, -0.5, -0.5, -0.5]]))
    torch.testing.assert_close(merged.scores, torch.tensor([1.0, 2.0, 2.0]))  # arange(B) + seed, kept in order
    assert merged.version == 3  # the oldest policy that contributed
    assert merged.ref_logps is None  # absent everywhere stays absent


def test_concat_experiences_drops_a_field_missing_from_any_part():
    with_logps = make_experience(1)
    with_logps.old_logps = torch.zeros(2, 3)
    merged = concat_experiences([with_logps, make_experience(2)], pad_token_id=0)
    assert merged.old_logps is None
    assert len(merged) == 4


def test_experience_split_and_select_sizes():
    experience = make_experience(1, batch_size=5)
    assert [len(part) for part in experience.split(2)] == [2, 2, 1]
    assert [len(part) for part in experience.split(5)] == [5]
    last = experience.split(2)[-1]
    torch.testing.assert_close(last.input_ids, experience.input_ids[4:])
    torch.testing.assert_close(last.scores, experience.scores[4:])
    picked = experience.select(torch.tensor([3, 0]))
    assert len(picked) == 2
    torch.testing.assert_close(picked.input_ids, experience.input_ids[[3, 0]])
    torch.testing.assert_close(picked.scores, torch.tensor([4.0, 1.0]))  # scores are arange(5) + 1
    assert picked.version == experience.version


def test_experience_as_batch_skips_absent_fields():
    experience = make_experience(1)
    assert set(experience.as_batch()) == {"input_ids", "attention_mask", "action_mask", "position_ids", "scores"}


def test_experience_file_format_keeps_optional_tensors_dtypes_version_and_info():
    from trainer.asynchronous.buffer import decode_experience, encode_experience

    experience = make_experience(1, version=5)
    experience.old_logps = torch.randn(2, 3, dtype=torch.float64)
    experience.behaviour_logps = torch.randn(2, 3)
    experience.info = {"reward/mean": 0.25}
    decoded = decode_experience(encode_experience(experience), "batch-00000001.safetensors")
    assert_same_experience(decoded, experience)
    assert decoded.old_logps.dtype == torch.float64 and decoded.values is None
    assert decoded.info == {"reward/mean": 0.25}


def test_experience_file_with_unknown_tensors_is_a_data_error_naming_it():
    from safetensors.torch import save

    from trainer.asynchronous.buffer import decode_experience
    from trainer.errors import DataError

    with pytest.raises(DataError, match=r"^b-1: unknown experience fields \['evil'\]"):
        decode_experience(save({"evil": torch.zeros(1), "scores": torch.zeros(1)}), "b-1")
