"""A small explorer: generate with the newest published weights, score, write experience batches.

It exercises the weight-sync protocol of the experience-driven `Trainer`: batch i may be
generated once weight version `(i - sync_offset) // sync_interval * sync_interval` (or newer) is
published, so the explorer runs at most `sync_offset` steps ahead of the trainer. It closes the
buffer when it has produced `total_steps` batches (or `num_batches`, if given), which ends the
trainer's run cleanly.
"""

from __future__ import annotations

import logging

import torch

from trainer.asynchronous.buffer import ExperienceBuffer, FileBuffer, buffer_dir
from trainer.asynchronous.weights import load_version, wait_for_version, weights_dir
from trainer.config import OnlineStageConfig
from trainer.context import seed_everything
from trainer.data.dataset import load_rows
from trainer.models import load_causal_lm, load_frozen, load_tokenizer
from trainer.online.experience import Experience
from trainer.online.prompts import PromptStream
from trainer.online.reward_sources import build_scorer
from trainer.online.rollout import generate_and_score
from trainer.runtime import pick_device, read_distributed_env

logger = logging.getLogger(__name__)


def required_version(batch_index: int, sync_interval: int, sync_offset: int) -> int:
    """Oldest weight version allowed to generate batch `batch_index` (bounded staleness)."""
    return max(0, (batch_index - sync_offset) // sync_interval * sync_interval)


class Explorer:
    """Generates experience batches from prompts with the newest published policy.

    Args:
        config: The stage config (model, prompts, generation, reward, `asynchronous` section).
        buffer: Where batches go; default the file buffer in `asynchronous.buffer_dir`.
    """

    def __init__(self, config: OnlineStageConfig, buffer: ExperienceBuffer | None = None) -> None:
        self.config = config
        self.options = config.asynchronous
        self.device = pick_device(read_distributed_env())
        self.tokenizer = load_tokenizer(config.model.path)
        self.policy = load_frozen(load_causal_lm, config.model, self.device)
        self.version = -1
        self.scorer = build_scorer(config, self.device)
        rows = load_rows(config.data.train_path, "prompt", skip_bad_rows=config.data.skip_bad_rows).examples
        self.prompts = PromptStream(rows, 1, 0, config.train.seed)
        self.buffer = buffer if buffer is not None else FileBuffer(buffer_dir(config))
        self.batch_size = config.algorithm.rollout_batch_size
        self.repeat = config.num_generations

    def refresh_weights(self, minimum: int) -> None:
        """Wait for version >= minimum; load the newest if it is newer than the one in use."""
        newest = wait_for_version(weights_dir(self.config), minimum, self.options.wait_timeout)
        if newest > self.version:
            self.version, state = load_version(weights_dir(self.config))
            self.policy.load_state_dict(state)
            logger.info("explorer loaded weight version %d", self.version)

    @torch.no_grad()
    def make_batch(self) -> Experience:
        rows = [row for row in self.prompts.take(self.batch_size) for _ in range(self.repeat)]
        rollout = generate_and_score(self.policy, self.tokenizer, rows, self.config.generation, self.device, self.scorer)
        return Experience(**{k: v.cpu() for k, v in rollout.batch.items()}, scores=rollout.scores.cpu(),
                          version=self.version)

    def run(self, num_batches: int | None = None) -> int:
        """Produce batches, then close the buffer. Returns the number of batches written."""
        seed_everything(self.config.train.seed + 1000)  # its own sampling stream
        # A resumed trainer publishes its current step as the first version: continue from there.
        first = wait_for_version(weights_dir(self.config), 0, self.options.wait_timeout)
        total = num_batches if num_batches is not None else self.options.total_steps
        try:
            for index in range(first, total):
                self.refresh_weights(required_version(index, self.options.sync_interval, self.options.sync_offset))
                self.buffer.put(self.make_batch())
                logger.info("explorer wrote batch %d with weight version %d", index + 1, self.version)
        finally:
            self.buffer.close()
        return max(0, total - first)

