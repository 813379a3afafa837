"""A small explorer: generate with the newest published weights, score, write numbered experience batches.

It exercises the weight-sync protocol of the experience-driven `Trainer`: batch n (1-based) may be
generated once weight version `(n - 1 - sync_offset) // sync_interval * sync_interval` (or newer)
is published, so the explorer runs at most `sync_offset` steps ahead of the trainer. It closes the
buffer when it has produced batch `total_steps` (or `num_batches`, if given), which ends the
trainer's run cleanly; an error marks the buffer FAILED with a one-line reason instead, which
stops the trainer with that reason. SIGTERM/SIGINT (`trainer.lifecycle.preemption`) stop it between batches
with neither marker: a restarted explorer simply continues.

Batch numbers are the buffer's (`trainer.asynchronous.buffer`): an explorer (re)started on an
existing buffer continues after the highest number written or discarded, with the prompts and
the sampling seed that batch would have had in an uninterrupted run, so a restart regenerates
nothing and skips nothing. Which weights it uses comes from the trainer's published version.

Each batch records the weight version that generated it and the per-token log-probs of its
responses under those weights (`behaviour_logps`, the same untempered softmax the trainer
computes), which the trainer needs to correct for staleness (`trainer.asynchronous.staleness`):
the engine's own where it returns them (`vllm`, so the correction also covers the engine's
numerical difference from the trainer), else a forward of the explorer's policy (`hf`).
Weights come from the weights directory, or from an in-process `Synchronizer` when the explorer
is a thread of the trainer's process.

Multi-turn episodes with over-sampling (`environment.oversample_groups`): the groups still running when a batch
has its `rollout_batch_size` complete groups carry over to the next batch, under the next weights, instead of being
dropped (`trainer.rollout.multi_turn.EpisodeCarry`). They run ahead of the next batch's new prompts, each keeps the
version it started under, and the batch records the oldest version among its rows; a carried group that would make
its batch older than `asynchronous.max_staleness` when the trainer takes it (batch n at trainer version n - 1) is
dropped. Their tokens' behaviour log-probs are those of the weights that sampled them: vLLM's own, or with `hf` a
forward of the explorer's policy over the carried episodes before it loads newer weights. Carried episodes live in
the explorer's memory: a restarted explorer starts without them (their prompts consumed, as dropped groups' are). Responses are sampled and scored by the stage's `Rollout`
(`trainer.rollout.builder.build_rollout`, through `rollout.engine`), synced to each newly loaded version.
"""

from __future__ import annotations

import logging

import torch

from trainer.algorithms.ppo import response_logps
from trainer.asynchronous.buffer import ExperienceBuffer, FileBuffer, buffer_dir
from trainer.asynchronous.synchronizer import Synchronizer
from trainer.asynchronous.weights import load_version, wait_for_version, weights_dir
from trainer.checkpointing.checkpoint import one_line
from trainer.config import OnlineStageConfig
from trainer.data.dataset import load_prompt_dataset
from trainer.lifecycle import preemption
from trainer.lifecycle.context import seed_everything
from trainer.modeling.models import load_causal_lm, load_frozen, load_tokenizer
from trainer.online.prompts import PromptStream, num_extra_groups
from trainer.rewards.weighted import build_weighted_scorer
from trainer.rollout.builder import build_agent, build_rollout
from trainer.rollout.engines import engine_setup
from trainer.rollout.experience import Experience
from trainer.rollout.multi_turn import EpisodeCarry
from trainer.runtime import pick_device, read_distributed_env
from trainer.tracking.timing import PhaseTimer

logger = logging.getLogger(__name__)


def required_version(batch_index: int, sync_interval: int, sync_offset: int) -> int:
    """Oldest weight version allowed to generate the batch of 0-based index `batch_index` (bounded staleness)."""
    return max(0, (batch_index - sync_offset) // sync_interval * sync_interval)


class Explorer:
    """Generates experience batches from prompts with the newest published policy.

    Args:
        config: The stage config (model, prompts, generation, reward, `asynchronous` section).
        buffer: Where batches go; default the file buffer in `asynchronous.buffer_dir`.
        synchronizer: Take weights from this in-process synchronizer instead of the weights directory.
    """

    def __init__(self, config: OnlineStageConfig, buffer: ExperienceBuffer | None = None,
                 synchronizer: Synchronizer | None = None) -> None:
        self.options = config.asynchronous
        self.device = pick_device(read_distributed_env())
        self.tokenizer = load_tokenizer(config.model.path)
        # Built first: reward services are asked once whether they answer, and a code tool's sandbox runs its
        # canary, before the policy loads.
        scorer = build_weighted_scorer(config, self.device)
        agent = build_agent(config.environment, self.tokenizer)  # multi-turn episodes, when set
        self.policy = load_frozen(load_causal_lm, config.model, self.device)  # also scores behaviour_logps
        self.rollout = build_rollout(config.rollout, policy=self.policy, tokenizer=self.tokenizer,
                                     generation=config.generation, scorer=scorer, device=self.device,
                                     setup=engine_setup(config), agent=agent,
                                     rows_per_call=(config.algorithm.rollout_batch_size + num_extra_groups(config))
                                     * config.num_generations)
        self.config = config = config.model_copy(update={"rollout": self.rollout.settings})  # `auto` chosen
        self.timer = PhaseTimer()  # the latest batch's sampling and scoring time, for its log line
        self.version = -1
        self.rows = load_prompt_dataset(config.data.train_path, self.tokenizer, config.data.max_length,
                                        config.data.skip_bad_rows).examples
        self.prompts = PromptStream(self.rows, 1, 0, config.train.seed)
        self.buffer = buffer if buffer is not None else FileBuffer(buffer_dir(config))
        self.batch_size = config.algorithm.rollout_batch_size
        self.num_extra = num_extra_groups(config)  # over-sampled prompts per batch, abandoned groups' included
        self.repeat = config.num_generations
        self.synchronizer = synchronizer
        # Over-sampled episodes: the groups still running when a batch is complete go on in the next one.
        self.carry = EpisodeCarry(agent.max_concurrent_steps) if agent is not None and self.num_extra else None

    def wait_for_version(self, minimum: int) -> int:
        """Block until weight version >= `minimum` is published; the newest version."""
        if self.synchronizer is not None:
            return self.synchronizer.wait_for_version(minimum, self.options.wait_timeout)
        return wait_for_version(weights_dir(self.config), minimum, self.options.wait_timeout)

    def refresh_weights(self, minimum: int) -> None:
        """Wait for version >= minimum; load the newest if it is not the one in use.

        "Not the one in use" rather than "newer": a restarted trainer republishes the older version
        of its checkpoint, and the explorer follows the trainer that is alive.
        """
        if self.wait_for_version(minimum) != self.version:
            if self.synchronizer is not None:
                self.version, state = self.synchronizer.get_model_state_dict()
            else:
                self.version, state = load_version(weights_dir(self.config))
            self.policy.load_state_dict(state)
            self.rollout.sync_weights(self.policy)  # the `hf` engine samples with self.policy: nothing to copy
            logger.info("explorer loaded weight version %d", self.version)

    def seek(self, batches_done: int) -> None:
        """Position the prompt stream after `batches_done` batches, as an uninterrupted explorer would be."""
        taken = batches_done * (self.batch_size + self.num_extra)
        self.prompts.restore(taken // len(self.rows), taken % len(self.rows))

    @torch.no_grad()
    def make_batch(self, number: int | None = None) -> Experience:
        """Sample and score batch `number` (1-based; it bounds the age of carried episodes, None: no bound); record
        its weight version (the oldest that sampled a row) and its behaviour log-probs."""
        rows = [row for row in self.prompts.take(self.batch_size + self.num_extra) for _ in range(self.repeat)]
        self.timer.reset()
        if self.carry is not None:  # the first `batch_size` groups to complete; the others go on in the next batch
            self.carry.version = self.version
            self.carry.oldest_version = (number - 1 - self.options.staleness_limit if number is not None
                                         else -(2**62))
            scored = self.rollout.collect(rows, self.timer, group_size=self.repeat, num_groups=self.batch_size,
                                          carry=self.carry)
        elif self.num_extra:  # the first `batch_size` groups to complete; the others' episodes are dropped
            scored = self.rollout.collect(rows, self.timer, group_size=self.repeat, num_groups=self.batch_size)
        else:
            scored = self.rollout.collect(rows, self.timer)
        behaviour_logps = scored.engine_logps  # (B, T) the sampler's own, where the engine gives them (vllm)
        if behaviour_logps is None or scored.engine_logps_known is not None:
            computed = response_logps(self.policy, scored.batch) * scored.batch["action_mask"]  # (B, T)
            behaviour_logps = computed if behaviour_logps is None else torch.where(
                scored.engine_logps_known, behaviour_logps, computed)  # carried tokens keep their older weights'
        if self.carry is not None:  # before newer weights load: the carried tokens' log-probs under these
            self.rollout.record_behaviour_logps(self.carry.episodes, lambda batch: response_logps(self.policy, batch))
        version = scored.oldest_version if scored.oldest_version is not None else self.version
        # Multi-turn episodes' `agent/*` travel with the batch (JSON metadata in the buffer); the trainer logs them.
        return Experience(**{k: v.cpu() for k, v in scored.batch.items()}, scores=scored.scores.cpu(),
                          behaviour_logps=behaviour_logps.cpu(), version=version, info=dict(scored.metrics))

    def close(self) -> None:
        """Free the rollout's engine (a vLLM engine's memory and threads) and the carried episodes' threads."""
        if self.carry is not None:
            self.carry.close()
        self.rollout.close()

    def run(self, num_batches: int | None = None) -> int:
        """Produce the batches after the buffer's last one up to `num_batches` (default `total_steps`),
        then close the buffer; on an error mark it failed and re-raise. Returns the number written."""
        total = num_batches if num_batches is not None else self.options.total_steps
        try:
            written, is_complete = self._produce(total)
        except Exception as err:
            self.buffer.fail(f"{type(err).__name__}: {one_line(err)}")
            raise
        if is_complete:
            self.buffer.close()
        return written

    def _produce(self, total: int) -> tuple[int, bool]:
        """Write batches `last_written + 1 .. total`; (count written, whether it got to the end)."""
        last = self.buffer.last_written()
        if last:
            logger.info("explorer continues after batch %d", last)
        self.seek(last)
        written = 0
        for number in range(last + 1, total + 1):
            if preemption.stop_requested():
                logger.warning("explorer stopped by signal %s before batch %d; a restarted explorer continues there",
                               preemption.signal_received(), number)
                return written, False
            self.refresh_weights(required_version(number - 1, self.options.sync_interval, self.options.sync_offset))
            # Each batch its own sampling stream: batch n is sampled alike however many restarts preceded it.
            seed_everything(self.config.train.seed + 1000 + number)
            number = self.buffer.put(self.make_batch(number))
            written += 1
            logger.info("explorer wrote batch %d with weight version %d (generate %.2f s, score %.2f s)", number,
                        self.version, self.timer.seconds["generate"], self.timer.seconds["score"])
        return written, True
