"""Running the experience-driven Trainer and the explorer: `--mode train`, `explore` or `both`.

`both` prepares the trainer here (vetting `output_dir`, taking its lease, resuming), then starts
the explorer as a child process in its own session (the same command with `--mode explore`) and
trains; the run ends
when the trainer reaches `asynchronous.total_steps` or the explorer closes the buffer. The child
dies with its parent: on Linux the kernel kills it when the parent exits for any reason, `kill -9`
included (PR_SET_PDEATHSIG); elsewhere it is killed when the parent exits through Python. A child
that dies without marking the buffer (a signal, an OOM kill) is marked FAILED for it, so the
trainer stops with one line instead of waiting out `asynchronous.wait_timeout`.

Every explorer holds a lease on its buffer directory (`<buffer_dir>/lease.json`, the heartbeat
lease of `trainer.lifecycle.lease`): a second explorer on the same buffer fails at once naming the first,
and a dead one's lease is taken over. Batch numbers are claimed by conditional writes besides, so
two explorers can never write the same batch.

A trainer that starts over (`checkpoint.resume: false`) empties the buffer; in `both` mode that
happens before its explorer starts. When trainer and explorer run as separate jobs, give such a
run a fresh `asynchronous.buffer_dir` and `weights_dir` instead (an explorer started first would
write into the old numbering).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from trainer.asynchronous.buffer import FileBuffer, buffer_dir
from trainer.asynchronous.engine import Trainer
from trainer.checkpointing.checkpoint import one_line
from trainer.config import OnlineStageConfig
from trainer.errors import LaunchError, LeaseError
from trainer.lifecycle import preemption
from trainer.lifecycle.lease import Lease, describe

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
FAILED_EXPLORER_EXIT_SECONDS = 10.0  # an explorer that marked the buffer FAILED gets this long to exit on its own


def run_trainer(config: OnlineStageConfig) -> str:
    return asyncio.run(_train(config))


async def _train(config: OnlineStageConfig, explorer_command: list[str] | None = None) -> str:
    trainer = Trainer(config)
    explorer: ExplorerProcess | None = None
    try:
        await trainer.prepare()
        if explorer_command is not None:
            explorer = ExplorerProcess(explorer_command, trainer.buffer, config)
        result = await trainer.train()
        if explorer is not None:
            explorer.finish(result)
        return result
    finally:
        if explorer is not None:
            explorer.stop()
        await trainer.shutdown()


def run_both(config: OnlineStageConfig, explorer_command: list[str]) -> str:
    """Prepare the trainer, start the explorer process, train, then check the explorer succeeded."""
    return asyncio.run(_train(config, explorer_command))


def take_buffer_lease(buffer: FileBuffer, config: OnlineStageConfig) -> Lease:
    """The lease of the one explorer that may write `buffer`; LeaseError naming the live holder otherwise."""
    lease = Lease(buffer.directory, config.checkpoint.lease_timeout_seconds)
    try:
        lease.acquire()
    except LeaseError as err:
        holder, _ = lease.read_holder()
        raise LeaseError(f"{lease.uri}: another explorer is writing {buffer.directory} "
                         f"({describe(holder or {}, time.time())}); stop it first, or wait: its lease is taken over "
                         f"when its heartbeat is older than checkpoint.lease_timeout_seconds "
                         f"({config.checkpoint.lease_timeout_seconds:g} s)") from err
    return lease


def run_explorer(config: OnlineStageConfig, num_batches: int | None = None) -> int:
    """Hold the buffer's lease, continue the buffer's numbering, produce; FAILED on any error."""
    from trainer.asynchronous.explorer import Explorer

    buffer = FileBuffer(buffer_dir(config))
    lease = take_buffer_lease(buffer, config)
    preemption.install(config.checkpoint.preemption_grace_seconds)
    try:
        buffer.clear_markers()  # a previous explorer's CLOSED or FAILED does not describe this one
        try:
            explorer = Explorer(config, buffer)
        except Exception as err:
            buffer.fail(f"{type(err).__name__}: {one_line(err)}")
            raise
        try:
            return explorer.run(num_batches)
        finally:
            explorer.close()  # a vLLM engine's memory and threads, the carried episodes' steps
    finally:
        preemption.uninstall()
        lease.release()


def _die_with_parent(parent_pid: int, prctl) -> None:
    """In the child, before exec: SIGKILL when the parent exits; exit now if it already has."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _spawn(command: list[str]) -> subprocess.Popen:
    preexec = None
    if sys.platform.startswith("linux"):
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
        parent = os.getpid()
        preexec = lambda: _die_with_parent(parent, prctl)  # noqa: E731
    # Its own session: a terminal's Ctrl-C reaches the parent only, which stops at a step boundary and
    # then kills the child; the child never mistakes it for its own failure.
    return subprocess.Popen(command, preexec_fn=preexec, start_new_session=True)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class ExplorerProcess:
    """The explorer child of `--mode both`, watched: if it dies without marking the buffer, it is marked FAILED.

    Args:
        command: The explorer's command line.
        buffer: The run's buffer.
        config: The stage config.
    """

    def __init__(self, command: list[str], buffer: FileBuffer, config: OnlineStageConfig) -> None:
        self.command, self.buffer, self.config = command, buffer, config
        buffer.clear_markers()  # the last attempt's CLOSED or FAILED does not describe the explorer to come
        self._stopping = threading.Event()
        self.process = _spawn(command)
        logger.info("started the explorer (pid %d)", self.process.pid)
        self._watcher = threading.Thread(target=self._watch, name="explorer-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        code = self.process.wait()
        if code == 0 or self._stopping.is_set() or preemption.signal_received() is not None:
            return
        if self.buffer.failure() is None and not self.buffer.is_closed():
            self.buffer.fail(f"the explorer process (pid {self.process.pid}) {describe_exit(code)}")

    def finish(self, result: str) -> None:
        """After training: a finished run waits for the explorer and requires its success; a preempted one stops it."""
        if result != "finished":
            return
        try:
            code = self.process.wait(timeout=self.config.asynchronous.wait_timeout)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the explorer (pid {self.process.pid}) did not exit within "
                              f"{self.config.asynchronous.wait_timeout:.0f} s after training ended") from None
        if code != 0:
            raise LaunchError(f"the explorer {describe_exit(code)}: {' '.join(self.command)}")

    def stop(self) -> None:
        """Kill the explorer if it still runs (it keeps no state: batches are written whole).

        An explorer that marked the buffer FAILED is already on its way out and prints its own error line
        last (the cause, which the trainer's ExplorerError only quotes); it gets a few seconds to do so.
        """
        self._stopping.set()
        if self.process.poll() is None and self.buffer.failure() is not None:
            try:
                self.process.wait(timeout=FAILED_EXPLORER_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def explorer_command(argv: list[str]) -> list[str]:
    """This process's command line with `--mode both` replaced by `--mode explore`."""
    args = list(argv)
    index = args.index("--mode")
    args[index + 1] = "explore"
    return [sys.executable, "-m", "trainer", *args]
