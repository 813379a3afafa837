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

from trainer.buffer import ExperienceBuffer, FileBuffer
from trainer.config import GRPOConfig, OnlineStageConfig
from trainer.data.dataset import load_rows
from trainer.data.tokenize import encode_prompt
from trainer.engine import buffer_dir, weights_dir
from trainer.experience import Experience
from trainer.models import load_causal_lm, load_tokenizer
from trainer.online import PromptStream
from trainer.online_stages import build_scorer
from trainer.rollout import decode_responses, generate
from trainer.runtime import pick_device, read_distributed_env
from trainer.stages import seed_everything
from trainer.weights import load_version, wait_for_version

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
        self.policy = load_causal_lm(config.model.model_copy(update={"lora": None, "gradient_checkpointing": False}))
        self.policy.requires_grad_(False).eval().to(self.device)
        self.version = -1
        self.scorer = build_scorer(config, self.device)
        rows = load_rows(config.data.train_path, "prompt", skip_bad_rows=config.data.skip_bad_rows).examples
        self.prompts = PromptStream(rows, 1, 0, config.train.seed)
        self.buffer = buffer if buffer is not None else FileBuffer(buffer_dir(config))
        options = config.grpo if isinstance(config, GRPOConfig) else config.ppo
        self.batch_size = options.rollout_batch_size
        self.repeat = config.grpo.num_generations if isinstance(config, GRPOConfig) else 1

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
        batch = generate(self.policy, self.tokenizer, [encode_prompt(self.tokenizer, r["prompt"]) for r in rows],
                         self.config.generation, self.device)
        scores = self.scorer(batch, [str(r["prompt"]) for r in rows], decode_responses(self.tokenizer, batch),
                             [r.get("answer") for r in rows])
        return Experience(**{k: v.cpu() for k, v in batch.items()}, scores=scores.cpu(), version=self.version)

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

