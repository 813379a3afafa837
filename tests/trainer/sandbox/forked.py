"""Run a function in a forked child and get back what it returned: restrictions stay in the child."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def in_child(function: Callable[[], object]) -> object:
    """`function()` in a fork of this process; its JSON-able return value, or {"raised": "..."}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            outcome = function()
        except BaseException as err:  # noqa: BLE001  (report anything to the parent)
            outcome = {"raised": f"{type(err).__name__}: {err}"}
        os.write(write_end, json.dumps(outcome).encode())
        os._exit(0)
    os.close(write_end)
    data = b"".join(iter(lambda: os.read(read_end, 1 << 16), b""))
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data)


def error_name(action: Callable[[], object]) -> str:
    """The errno name `action` failed with, or "ok"."""
    import errno

    try:
        action()
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
    return "ok"
