"""A "latest" pointer: a small object naming the newest complete entry of a directory.

Checkpoints (`checkpoints/latest` -> `step-00000042`) and published weight versions
(`weights/LATEST` -> `version-00000007.safetensors`) use the same protocol: the pointer is written
after the entry it names, so a reader never follows it to a partial one, and it holds a bare name
that must match the entries' pattern, so a pointer planted by whoever can write the prefix
(`../other-run`) cannot lead a reader out of the directory.
"""

from __future__ import annotations

import re

from trainer.errors import CheckpointError
from trainer.storage import Storage, join_uri


def write_pointer(storage: Storage, directory: str, pointer: str, entry: str) -> None:
    """Make `directory/pointer` name `entry` (one whole-object write: readers see the old or the new name)."""
    storage.write_bytes(join_uri(directory, pointer), entry.encode())


def read_pointer(storage: Storage, directory: str, pointer: str, entry_pattern: re.Pattern) -> str | None:
    """The entry `directory/pointer` names, None when there is no pointer; CheckpointError when it names
    anything but an entry of this directory."""
    uri = join_uri(directory, pointer)
    if not storage.exists(uri):
        return None
    name = storage.read_bytes(uri).decode(errors="replace").strip()
    if not entry_pattern.fullmatch(name):
        raise CheckpointError(f"{uri} holds {name[:80]!r}, expected the name of an entry of {directory} "
                              f"(like {entry_pattern.pattern})")
    return name
