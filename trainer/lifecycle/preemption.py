"""Graceful preemption: SIGTERM or SIGINT ends a run at the next step boundary, with a checkpoint.

Kubernetes sends SIGTERM to a pod it evicts (node drain, spot reclaim, a deleted PyTorchJob) and
SIGKILL `terminationGracePeriodSeconds` (30 s by default) later; torchrun forwards the signal to
every worker. `install` replaces the SIGTERM and SIGINT handlers with one that only records the
signal. Training loops ask `stop_requested()` at step (supervised) or episode (online) boundaries:
it is an all-reduce, so every rank stops at the same step even when only one got the signal. The
loop then writes a blocking checkpoint (which also publishes the metrics), and the entry point
exits with `exit_code()`: 128 + the signal number (143 for SIGTERM, 130 for SIGINT), a status the
Training Operator's `ExitCode` restart policy treats as retryable.

If the step, the checkpoint or a collective has not finished `grace_seconds` after the signal, a
watchdog ends the process with the same status; the rerun then resumes from the previous complete
checkpoint (a half-written one is never used). A second SIGINT ends the process at once.

Signals are delivered to a process, not to an object, so the state here is per process (one
`_State`, reset by every `install`); nothing else in the trainer is.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

logger = logging.getLogger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGINT)


@dataclass(slots=True)
class _State:
    grace_seconds: float = 20.0
    signal_number: int | None = None
    """The first signal received (this rank), or the one a peer reported through `stop_requested`."""
    received_at: float | None = None
    acted: bool = False
    """A loop saw `stop_requested()` return True and is stopping at a step boundary."""
    watchdog: threading.Timer | None = None


_state = _State()
_previous: dict[int, object] = {}


def install(grace_seconds: float) -> bool:
    """Handle SIGTERM and SIGINT from now on (main thread only); forget any earlier signal.

    Returns:
        True if the handlers were installed; False off the main thread (asynchronous engine threads),
        where the process keeps its default handlers.
    """
    global _state
    if _state.watchdog is not None:
        _state.watchdog.cancel()
    _state = _State(grace_seconds=grace_seconds)
    if threading.current_thread() is not threading.main_thread():
        return False
    for number in HANDLED:
        previous = signal.signal(number, _handle)
        _previous.setdefault(number, previous)
    return True


def uninstall() -> None:
    """Restore the handlers `install` replaced (a watchdog already running keeps the exit deadline)."""
    if _state.watchdog is not None and _state.signal_number is None:
        _state.watchdog.cancel()
        _state.watchdog = None
    if threading.current_thread() is not threading.main_thread():
        return
    for number, previous in list(_previous.items()):
        signal.signal(number, previous)
        del _previous[number]


def _handle(number: int, frame: FrameType | None) -> None:
    if _state.signal_number is not None:
        if number == signal.SIGINT:
            os._exit(128 + number)  # a second Ctrl-C: stop now
        return
    _record(number)
    logger.warning("%s received: stopping at the next step boundary with a checkpoint (within %.0f s)",
                   signal.Signals(number).name, _state.grace_seconds)


def _record(number: int) -> None:
    _state.signal_number, _state.received_at = number, time.monotonic()
    _state.watchdog = threading.Timer(_state.grace_seconds, _expire, args=(number,))
    _state.watchdog.daemon = True
    _state.watchdog.start()


def _expire(number: int) -> None:
    name = signal.Signals(number).name
    logger.error("%s: the preemption grace period (checkpoint.preemption_grace_seconds = %.0f s) ran out before "
                 "the stopping checkpoint was complete; exiting with %d, the rerun resumes from the previous "
                 "complete checkpoint", name, _state.grace_seconds, 128 + number)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(128 + number)


def signal_received() -> int | None:
    """The signal this process got (or a peer reported), or None."""
    return _state.signal_number


def stop_requested() -> bool:
    """Whether any rank received SIGTERM/SIGINT: a collective that every rank calls at the same point.

    Returns:
        True on every rank if one of them got a signal; the caller then saves and stops.
    """
    import torch
    import torch.distributed as dist

    local = _state.signal_number or 0
    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([local], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        local = int(flag.item())
    if local and _state.signal_number is None:
        _record(local)  # a peer was signalled: this rank stops at the same step, under the same deadline
    if local:
        _state.acted = True
    return bool(local)


def stopped_by_signal() -> bool:
    """Whether the run stopped early because of a signal (not one that arrived after training ended)."""
    return _state.acted and _state.signal_number is not None


def exit_code() -> int:
    """128 + the signal number: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + (_state.signal_number or signal.SIGTERM)
