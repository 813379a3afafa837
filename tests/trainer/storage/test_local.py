"""Local storage writes through temporary files, yet what it leaves has the mode `open()` gives a new file."""

from __future__ import annotations

import os

import pytest

from trainer.storage.local import LocalStorage, default_file_mode


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_get_the_mode_open_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        storage = LocalStorage()
        storage.write_bytes(str(tmp_path / "metrics.json"), b"{}")
        storage.create_exclusive(str(tmp_path / "lease"), b"x")
        (tmp_path / "plain").write_bytes(b"")
        expected = 0o666 & ~umask
        assert default_file_mode() == expected
        assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
            "metrics.json": expected, "lease": expected, "plain": expected}
    finally:
        os.umask(previous)


def test_a_folder_this_user_cannot_write_is_named_before_anything_loads(tmp_path, monkeypatch):
    """An image whose WORKDIR belongs to root, run as uid 1000, with a relative output_dir: named up front."""
    from trainer.storage.local import directory_problem

    locked = tmp_path / "workdir"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    assert directory_problem(locked / "runs" / "sft") == (
        f"{locked / 'runs' / 'sft'} cannot be created: {locked} is not writable by this user (uid {os.getuid()})")
    assert directory_problem(locked) == f"{locked} is not writable by this user (uid {os.getuid()})"
    assert directory_problem(tmp_path / "elsewhere") is None


def test_a_failed_write_is_one_storage_error_naming_the_uri(tmp_path):
    from trainer.errors import StorageError

    (tmp_path / "file").write_text("")
    storage = LocalStorage()
    for write in (lambda uri: storage.write_bytes(uri, b"{}"), lambda uri: storage.create_exclusive(uri, b"x"),
                  lambda uri: storage.upload_file(tmp_path / "file", uri)):
        with pytest.raises(StorageError, match=r"file/out/x: cannot write: Not a directory"):
            write(str(tmp_path / "file" / "out" / "x"))
