"""Attacker-made files for the security tests: pickles that run a command when loaded.

Each payload creates a marker file when (and only when) something unpickles it, so a test shows
that nothing ran by asserting the marker does not exist.
"""

from __future__ import annotations

import io
import os
import shlex
from pathlib import Path

import torch


class RunsCommand:
    """Unpickling this calls `os.system(command)`: what a crafted checkpoint or batch would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def code_running_torch_file(marker: Path) -> bytes:
    """A `torch.save` file (the format of `.pt` files) whose loading creates `marker`."""
    buffer = io.BytesIO()
    torch.save({"state": RunsCommand(f"touch {shlex.quote(str(marker))}")}, buffer)
    return buffer.getvalue()
