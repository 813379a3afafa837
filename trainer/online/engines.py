"""Rollout engines: what samples the responses of the online stages, behind one small interface.

`RolloutEngine.generate` turns a batch of left-padded prompts into sampled response tokens;
`load_weights` takes the policy's state dict, and `sync_from` brings the engine up to the trained
actor after its updates. The colocated loop (`trainer.online.loop`), its evaluation and the
asynchronous explorer (`trainer.asynchronous.explorer`) all sample through it; what happens to the
tokens afterwards (stop tokens, masks, decoding, scoring) is `trainer.online.rollout`, the same for
every engine.

`hf` (the default, `rollout.engine: hf`) samples with Hugging Face `generate` (KV cache on) on the
policy module itself, so in the colocated loop it shares the actor's weights and `sync_from` has
nothing to copy. On the CPU it samples with `rollout.num_threads` intra-op threads (1 by default:
decode steps are too small to split across threads). An FSDP2-sharded policy's forward all-gathers
its layers (a collective), so it samples with `synced_gpus=True`: a rank whose responses all ended
keeps running forwards until every rank's have, and all ranks make the same number of calls.

Where a faster engine plugs in (vLLM or SGLang, on GPU images; not implemented here): a subclass of
`RolloutEngine` whose `generate` hands the prompt ids to the engine (vLLM: `LLM.generate` with
`TokensPrompt`s and `SamplingParams(temperature, top_p, top_k, max_tokens, stop_token_ids)`) and
right-pads the returned token ids into (B, R), and whose `load_weights` pushes the actor's state
dict into the engine's model (vLLM: the worker model's `load_weights(state.items())`; SGLang:
`update_weights_from_tensor`). Those read checkpoint names, which are not always the module's
(GPT-NeoX's head is `embed_out` there): rename with `trainer.modeling.checkpoint_keys.to_checkpoint_names`
first, as `save_pretrained` does. Register it in `ROLLOUT_ENGINES` and add its name to
`RolloutConfig.engine`'s choices.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig, RolloutConfig
from trainer.parallel.booster import unwrap_model


class RolloutEngine(ABC):
    """Samples responses with some copy of the policy's weights."""

    @abstractmethod
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, options: GenerationConfig, *,
                 stop_token_ids: list[int], pad_token_id: int) -> Tensor:
        """Sample one response per prompt.

        Args:
            prompt_ids, prompt_mask: (B, P) left-padded prompts and their attention mask.
            options: Sampling settings (`generation` section).
            stop_token_ids: A response ends after the first of these (EOS included).
            pad_token_id: Fills rows that ended before the longest one.

        Returns:
            (B, R) response token ids, R the longest response; what follows a row's first stop token
            is ignored by the caller.
        """

    @abstractmethod
    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Take the policy's weights (an unwrapped model's `state_dict`)."""

    def sync_from(self, policy: nn.Module) -> None:
        """Bring the engine up to `policy`'s current weights (after optimizer steps)."""
        self.load_weights(unwrap_model(policy).state_dict())


class HFGenerateEngine(RolloutEngine):
    """Hugging Face `generate` (with its KV cache) on `model`; in eval mode while sampling.

    Args:
        model: The policy (possibly wrapped by a booster); sampling uses its weights as they are.
        num_threads: CPU intra-op threads while sampling on the CPU; None keeps the process's setting.
    """

    def __init__(self, model: nn.Module, num_threads: int | None = None) -> None:
        self.model = model
        self.num_threads = num_threads

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, options: GenerationConfig, *,
                 stop_token_ids: list[int], pad_token_id: int) -> Tensor:
        sampling = {"do_sample": False} if options.temperature == 0 else {
            "do_sample": True, "temperature": options.temperature, "top_p": options.top_p,
            "top_k": options.top_k or None}
        policy = unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        try:
            with cpu_threads(self.num_threads if prompt_ids.device.type == "cpu" else None):
                output = policy.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                                         max_new_tokens=options.max_new_tokens, eos_token_id=stop_token_ids,
                                         pad_token_id=pad_token_id, use_cache=True,
                                         synced_gpus=is_sharded(policy), **sampling)
        except RuntimeError as err:  # torch.multinomial on NaN/inf probabilities
            if "inf" not in str(err) and "nan" not in str(err):
                raise
            from trainer.errors import TrainingError

            raise TrainingError("the policy's next-token probabilities are not finite (NaN/inf) while sampling "
                                "responses: the actor diverged; lower optimizer.lr or check the reward") from err
        finally:
            policy.train(was_training)
        return output[:, prompt_ids.shape[1]:]  # (B, R)

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
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


ROLLOUT_ENGINES: dict[str, Callable[[nn.Module, RolloutConfig], RolloutEngine]] = {
    "hf": lambda policy, config: HFGenerateEngine(policy, config.num_threads),
}


def build_rollout_engine(config: RolloutConfig, policy: nn.Module) -> RolloutEngine:
    """The engine `rollout.engine` names, set up to sample with `policy`'s weights."""
    if config.engine not in ROLLOUT_ENGINES:  # the config's choices and this table are kept in step
        from trainer.errors import ConfigError

        raise ConfigError(f"rollout.engine: unknown engine {config.engine!r}; expected one of "
                          f"{', '.join(sorted(ROLLOUT_ENGINES))}")
    return ROLLOUT_ENGINES[config.engine](policy, config)


def as_engine(sampler: RolloutEngine | nn.Module) -> RolloutEngine:
    """`sampler` if it is an engine, else the default (`hf`) engine on that model (evaluation of saved models)."""
    return sampler if isinstance(sampler, RolloutEngine) else HFGenerateEngine(sampler)
