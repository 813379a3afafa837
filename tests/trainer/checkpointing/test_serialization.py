"""Tests for `trainer.checkpointing.serialization`: the pickle-free formats of files read back from shared storage."""

from __future__ import annotations

import pytest
import torch

from trainer.checkpointing.serialization import dump_tensors, load_json, load_tensors
from trainer.errors import CheckpointError, DataError


def test_tensors_and_metadata_round_trip_including_tied_and_strided_tensors():
    weight = torch.arange(6.0).reshape(2, 3)
    tensors = {"embed": weight, "head": weight, "column": weight[:, 1], "empty": torch.zeros(0)}  # tied, a view
    payload = dump_tensors(tensors, {"version": "7"})
    loaded, metadata = load_tensors(payload, "x.safetensors", DataError)
    assert metadata == {"version": "7"}
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor), name
    assert weight.data_ptr() != loaded["head"].data_ptr()


def test_bytes_that_are_not_safetensors_are_an_error_of_the_callers_domain_naming_the_file():
    with pytest.raises(CheckpointError, match=r"^s3://b/k/x\.safetensors: not a safetensors file .*never unpickles"):
        load_tensors(b"\x80\x04garbage", "s3://b/k/x.safetensors", CheckpointError)


@pytest.mark.parametrize(("payload", "message"), [(b"{", "not valid JSON"), (b"[1]", "expected a JSON dict, found list"),
                                                  (b"\xff\xfe", "not valid JSON")])
def test_json_that_is_not_the_expected_shape_is_an_error_naming_the_file(payload, message):
    with pytest.raises(DataError, match=rf"^state\.json: {message}"):
        load_json(payload, "state.json", DataError)
