"""Python's cyclic garbage collector in a trainer process: paused while a stage starts, frozen at exit.

A full collection walks every object the collector tracks, and a trainer's imports (torch, transformers,
mlflow, sqlalchemy) leave over half a million of them, alive until the process ends. While a stage starts
the heap only grows, so the collector walks it again and again and finds next to nothing: eight full
collections, 1.1-1.3 s, in the start of the tiny SFT job the pipeline tests run. At exit the interpreter walks
it all once more (1.8 s there) only to free memory the OS takes back anyway. Every job paid both, and every
kfp task and torchrun agent the second (docs/testing.md, "Where a job's time goes").

`python -m trainer` pauses collection while its stage starts (`pause_while_starting`). `open_outputs`, the
last step of every training stage's setup, turns it back on (`resume`), as does the evaluation once its
scorers are built, and the entry itself should setup fail. Collection during the steps is Python's own.

`freeze_at_exit` puts every object out of the collector's reach when the interpreter finalises. The atexit
handlers (logging flushed and closed, temporary folders removed) still run, and an object nothing refers to
is still freed at once; only the last walk for reference cycles is skipped, whose finalizers Python never
promised to run at exit anyway. Not where triton's compiled bindings are loaded (torch's compiler on GPUs,
vLLM): they are nanobind's, which reports each of its objects still alive when the interpreter ends as a leak,
some hundred lines at the end of a job's log. There the exit unfreezes everything instead, what setup and
vLLM froze included, and the interpreter collects as it always did.
"""

from __future__ import annotations

import atexit
import gc
import sys

_paused = False
_exit_registered = False
# Modules built with nanobind, which lists every one of its objects alive at the interpreter's end as a leak.
_NANOBIND_MODULES = ("triton._C",)


def pause_while_starting() -> None:
    """Stop automatic collection until `resume` (a process entry's call, before its stage's setup)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Turn collection back on if `pause_while_starting` turned it off; otherwise nothing.

    What setup left alive (modules, models, data) is frozen first: turned back on, the collector would walk all of
    it at once (0.85 s on the tiny RM job) and find it still alive. A reference cycle among those objects that
    dies later is never collected; the memory that can hold is bounded by what setup built, and does not grow
    with the steps.
    """
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def is_paused() -> bool:
    return _paused


def freeze_at_exit() -> None:
    """Skip the interpreter's last collection at exit, unless nanobind's modules are loaded then (once a process)."""
    global _exit_registered
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_before_the_last_collection)


def _before_the_last_collection() -> None:
    if any(name.startswith(_NANOBIND_MODULES) for name in sys.modules):
        gc.unfreeze()
    else:
        gc.freeze()
