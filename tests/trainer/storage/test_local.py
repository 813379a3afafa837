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
