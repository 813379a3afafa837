"""Running the experience-driven Trainer and the explorer: `--mode train`, `explore` or `both`.

`both` starts the explorer as a second process (the same command with `--mode explore`) and runs
the trainer in this one; the run ends when the trainer reaches `asynchronous.total_steps` or the
explorer closes the buffer.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

from trainer.asynchronous.engine import Trainer
from trainer.config import OnlineStageConfig
from trainer.errors import LaunchError

logger = logging.getLogger(__name__)


async def _train(config: OnlineStageConfig) -> str:
    trainer = Trainer(config)
    try:
        await trainer.prepare()
        return await trainer.train()
    finally:
        await trainer.shutdown()


def run_trainer(config: OnlineStageConfig) -> str:
    return asyncio.run(_train(config))


def run_explorer(config: OnlineStageConfig, num_batches: int | None = None) -> int:
    from trainer.asynchronous.explorer import Explorer

    return Explorer(config).run(num_batches)


def run_both(config: OnlineStageConfig, explorer_command: list[str]) -> str:
    """Start the explorer process, train here, then wait for the explorer and check it succeeded."""
    from trainer.asynchronous.buffer import FileBuffer, buffer_dir

    FileBuffer(buffer_dir(config)).reset()
    explorer = subprocess.Popen(explorer_command)
    try:
        result = run_trainer(config)
    except BaseException:
        explorer.terminate()
        raise
    try:
        code = explorer.wait(timeout=config.asynchronous.wait_timeout)
    except subprocess.TimeoutExpired:
        explorer.kill()
        raise LaunchError(f"the explorer did not exit within {config.asynchronous.wait_timeout:.0f} s") from None
    if code != 0:
        raise LaunchError(f"the explorer exited with code {code}: {' '.join(explorer_command)}")
    return result


def explorer_command(argv: list[str]) -> list[str]:
    """This process's command line with `--mode both` replaced by `--mode explore`."""
    args = list(argv)
    index = args.index("--mode")
    args[index + 1] = "explore"
    return [sys.executable, "-m", "trainer", *args]
