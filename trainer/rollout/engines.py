"""Rollout engines: what samples the responses of the online stages, behind one small interface.

`RolloutEngine.generate` turns a batch of left-padded prompts into sampled response tokens (and,
where the engine computes them, each sampled token's log-prob); `sync_from` brings the engine up to
the trained actor after its updates, and `close` frees what the engine holds. Every `Rollout`
(`trainer.rollout.interface`: the colocated loop's, its evaluation's, `python -m trainer evaluate`'s
and the asynchronous explorer's) samples through one; what happens to the tokens afterwards (stop
tokens, masks, decoding, scoring) is the rollout's (`trainer.rollout.single_turn`,
`trainer.rollout.multi_turn`), the same for every engine.

`hf` (the default, `rollout.engine: hf`) samples with Hugging Face `generate` (KV cache on) on the
policy module itself, so in the colocated loop it shares the actor's weights and `sync_from` has
nothing to copy. Rows with the same prompt (GRPO's groups) share one prefill of it
(`trainer.modeling.shared_prompts.prefilled_prompts`). On the CPU it samples with `rollout.num_threads`
intra-op threads (`sampling_threads`: by default 1 for small batches where OpenMP's threads wait
passively, since waking a thread costs more than a tiny decode step's product saves, and the training's
threads otherwise). An FSDP2-sharded
policy's forward all-gathers its layers (a collective), so it samples with `synced_gpus=True`: a rank
whose responses all ended keeps running forwards until every rank's have, and all ranks make the same
number of calls.

`vllm` (`trainer.rollout.vllm_engine`) keeps its own copy of the weights in vLLM's offline engine and
returns vLLM's per-token log-probs. An engine that keeps its own weights is built from an
`EngineSetup` (where the initial weights are, the seed, the LoRA adapters' shape).

This module is the interface (and the default engine); it imports no other engine. The engine a
config names is built by `trainer.rollout.engine_registry.build_rollout_engine`, which imports vLLM
only when asked for, and which `trainer.rollout.builder.build_rollout` calls. Another engine
(SGLang) is a third subclass, registered in `engine_registry.ROLLOUT_ENGINES` and added to
`RolloutConfig.engine`'s choices.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig, LoraConfig, OnlineStageConfig
from trainer.modeling.shared_prompts import prefilled_prompts, shares_prompts
from trainer.parallel.booster import unwrap_model


@dataclass(slots=True)
class SampledResponses:
    """One batch of sampled responses.

    Attributes:
        ids: (B, R) response token ids, R the longest response, right-padded; what follows a row's
            first stop token is ignored by the caller.
        logps: (B, R) the engine's log-probability of each sampled token under the untempered
            softmax (as `trainer.algorithms.ppo.response_logps` computes it), 0 on padding; None when
            the engine does not compute them (`hf`).
    """

    ids: Tensor
    logps: Tensor | None = None


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """What an engine with its own copy of the weights needs besides the policy module.

    Attributes:
        model_path: The model directory (local or URI) whose config, and initial weights, the engine loads.
        seed: The engine's own seed (sampling is seeded per request from torch's generator, see `vllm_engine`).
        lora: The policy's `model.lora` when it carries LoRA adapters (pushed alone, or merged into the weights
            it sends: `rollout.vllm.lora_sync`); None otherwise.
    """

    model_path: str
    seed: int = 0
    lora: LoraConfig | None = None

    @property
    def lora_scale(self) -> float | None:
        """alpha / r, what the adapters are scaled by when merged; None without LoRA."""
        return self.lora.alpha / self.lora.r if self.lora else None


def engine_setup(config: OnlineStageConfig) -> EngineSetup:
    """The setup of an online stage's engine: the actor's starting weights, the run's seed, its LoRA adapters."""
    return EngineSetup(config.model.path, config.train.seed, config.model.lora)


class RolloutEngine(ABC):
    """Samples responses with some copy of the policy's weights."""

    @abstractmethod
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, options: GenerationConfig, *,
                 stop_token_ids: list[int], pad_token_id: int) -> SampledResponses:
        """Sample one response per prompt.

        Args:
            prompt_ids: (B, P) left-padded prompts.
            prompt_mask: (B, P) their attention mask.
            options: Sampling settings (`generation` section).
            stop_token_ids: A response ends after the first of these (EOS included).
            pad_token_id: Fills rows that ended before the longest one.

        Returns:
            The response ids (and log-probs, where the engine computes them).
        """

    @abstractmethod
    def sync_from(self, policy: nn.Module) -> None:
        """Bring the engine up to `policy`'s current weights (after optimizer steps).

        Args:
            policy: The trained actor, possibly wrapped by a booster or sharded (FSDP2).
        """

    def close(self) -> None:
        """Free what the engine holds (its own weights, caches, threads); the `hf` engine holds nothing."""

    def turn_stream(self, options: GenerationConfig, *, stop_token_ids: list[int],
                    num_rows: int) -> contextlib.AbstractContextManager | None:
        """A context in which turns are sampled one request at a time and batched continuously (the
        `trainer.rollout.vllm_turns.TurnStream` it yields), or None where the engine samples in whole batches only
        (`hf`: `generate` cannot take a row in mid-call). `num_rows`: the rollout's rows, which set its threads.
        """
        return None


class HFGenerateEngine(RolloutEngine):
    """Hugging Face `generate` (with its KV cache) on `model`; in eval mode while sampling.

    Args:
        model: The policy (possibly wrapped by a booster); sampling uses its weights as they are.
        num_threads: CPU intra-op threads while sampling on the CPU (`rollout.num_threads`: `auto` decides per
            call, `sampling_threads`); None keeps the process's setting.
    """

    def __init__(self, model: nn.Module, num_threads: int | str | None = None) -> None:
        self.model = model
        self.num_threads = num_threads

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, options: GenerationConfig, *,
                 stop_token_ids: list[int], pad_token_id: int) -> SampledResponses:
        sampling = {"do_sample": False} if options.temperature == 0 else {
            "do_sample": True, "temperature": options.temperature, "top_p": options.top_p,
            "top_k": options.top_k or None}
        policy = unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        try:
            threads = sampling_threads(self.num_threads, len(prompt_ids))
            with cpu_threads(threads if prompt_ids.device.type == "cpu" else None):
                prefilled = prefilled_prompts(policy, prompt_ids, prompt_mask) if shares_prompts(policy) else {}
                output = policy.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                                         max_new_tokens=options.max_new_tokens, eos_token_id=stop_token_ids,
                                         pad_token_id=pad_token_id, use_cache=True,
                                         synced_gpus=is_sharded(policy), **sampling, **prefilled)
        except RuntimeError as err:  # torch.multinomial on NaN/inf probabilities
            if "inf" not in str(err) and "nan" not in str(err):
                raise
            from trainer.errors import TrainingError

            raise TrainingError("the policy's next-token probabilities are not finite (NaN/inf) while sampling "
                                "responses: the actor diverged; lower optimizer.lr or check the reward") from err
        finally:
            policy.train(was_training)
        return SampledResponses(output[:, prompt_ids.shape[1]:])  # (B, R)

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Load a whole state dict into the sampled model (`sync_from`; a gathered copy in `benchmarks/gpu_check.py`)."""
        unwrap_model(self.model).load_state_dict(state_dict)

    def sync_from(self, policy: nn.Module) -> None:
        if unwrap_model(policy) is not unwrap_model(self.model):  # sampling with the actor itself: nothing to copy
            self.load_weights(unwrap_model(policy).state_dict())


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is FSDP2-sharded: its forward is then a collective that every rank must run.

    Hugging Face only turns `synced_gpus` on by itself for models it sharded (`_is_fsdp_managed_module`),
    not for a plain `fully_shard`, so it is passed explicitly.
    """
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """`torch.set_num_threads(count)` inside the block, the previous count restored after; None changes nothing."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count is not None:
            torch.set_num_threads(previous)


# Under passive OpenMP waits, the batch size (rows sampled at once) from which a decode step's products are large
# enough to pay for waking a second thread: HF `generate` of the 3.2M benchmark model, 64 new tokens, 1 thread
# against 2 took 0.80x the time at 64 rows, 0.93x at 96, 1.03x at 128 and 1.10x at 256 (benchmarks/README.md).
PASSIVE_ROWS_FOR_ALL_THREADS = 128


def sampling_threads(setting: int | str | None, rows: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The intra-op threads to sample `rows` sequences with on the CPU (`rollout.num_threads`); None keeps the
    process's setting (the training's threads).

    `auto`: 1 when OpenMP's threads wait passively (`OMP_WAIT_POLICY=PASSIVE`, read by OpenMP when the process
    started) and fewer than `PASSIVE_ROWS_FOR_ALL_THREADS` rows are sampled, else None. A passive thread sleeps
    between parallel regions and is woken by a system call for each matrix product, which the tiny products
    of a small decode batch do not pay for; a spinning thread is woken for free, and then the training's
    threads sample faster at every batch size measured.
    """
    if setting != "auto":
        return setting  # type: ignore[return-value]
    policy = (os.environ if environ is None else environ).get("OMP_WAIT_POLICY", "")
    return 1 if policy.strip().upper() == "PASSIVE" and rows < PASSIVE_ROWS_FOR_ALL_THREADS else None


def as_engine(sampler: RolloutEngine | nn.Module) -> RolloutEngine:
    """`sampler` if it is an engine, else the default (`hf`) engine on that model (evaluation of saved models)."""
    return sampler if isinstance(sampler, RolloutEngine) else HFGenerateEngine(sampler)
