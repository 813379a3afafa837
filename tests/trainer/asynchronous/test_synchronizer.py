"""Tests of the in-process weight channel `trainer.asynchronous.synchronizer.Synchronizer`."""

import threading
import time

import pytest
import torch

from trainer.asynchronous.synchronizer import Synchronizer
from trainer.errors import WaitTimeout


def test_a_waiting_reader_gets_the_version_set_by_another_thread():
    synchronizer = Synchronizer()
    state = {"weight": torch.ones(2)}
    threading.Timer(0.05, synchronizer.set_model_state_dict, args=(state, 3)).start()
    assert synchronizer.wait_for_version(2, timeout=5) == 3
    version, got = synchronizer.get_model_state_dict()
    assert version == 3 and got is state


def test_waiting_for_an_unpublished_version_times_out():
    synchronizer = Synchronizer()
    synchronizer.set_model_state_dict({}, 0)
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="weight version 1 not uploaded after 0.1 s"):
        synchronizer.wait_for_version(1, timeout=0.1)
    assert time.monotonic() - started < 2


def test_reading_before_the_first_upload_is_a_timeout_error():
    with pytest.raises(WaitTimeout, match="no weight version"):
        Synchronizer().get_model_state_dict()
