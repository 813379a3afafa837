"""The prompt rows an online stage samples from, as an endless stream that resumes where it stopped."""

from __future__ import annotations

from trainer.config import OnlineStageConfig
from trainer.data.sampler import ResumableSampler


def num_extra_groups(config: OnlineStageConfig) -> int:
    """Prompts a rollout takes beyond `rollout_batch_size` (`environment.oversample_groups`; 0 without episodes).

    They are consumed like the others: the stream's position (checkpointed) moves by `rollout_batch_size` plus this
    at every collect step, whichever groups complete, and a resume never retries an abandoned group's prompt.
    """
    return config.environment.oversample_groups if config.environment is not None else 0


class PromptStream:
    """Endless, resumable stream of this rank's prompt rows, re-shuffled every pass."""

    def __init__(self, rows: list[dict], world_size: int, rank: int, seed: int) -> None:
        self.rows = rows
        self.world_size = world_size
        self.sampler = ResumableSampler(len(rows), world_size, rank, shuffle=True, seed=seed)
        self.epoch = 0
        self.consumed = 0  # this rank's rows taken in the current pass
        self._iterator = None

    def restore(self, epoch: int, consumed_global: int) -> None:
        self.epoch, self.consumed, self._iterator = epoch, consumed_global // self.world_size, None

    def position(self) -> dict[str, int]:
        return {"prompt_epoch": self.epoch, "prompt_samples": self.consumed * self.world_size}

    def take(self, count: int) -> list[dict]:
        rows = []
        while len(rows) < count:
            if self._iterator is None:
                self.sampler.set_epoch(self.epoch)
                self.sampler.skip(self.consumed)
                self._iterator = iter(self.sampler)
            index = next(self._iterator, None)
            if index is None:
                self.epoch, self.consumed, self._iterator = self.epoch + 1, 0, None
                continue
            rows.append(self.rows[index])
            self.consumed += 1
        return rows
