"""An agent episode's KV cache carried from one turn to the next, so that a turn with the `hf` engine runs only
the tokens it has not seen instead of re-reading the whole episode.

Hugging Face `generate` keeps no cache between calls, so an episode's turn k would prefill its prompt, its k - 1
earlier turns and their observations again. Here each episode keeps the keys and values of every token it has fed
(`EpisodeCache`, padding removed), and `sample_next_turns` samples one turn for a batch of such episodes:

- the batch's cache is every episode's carried keys and values, left-padded to the longest; after it come the ids
  not yet fed (the last token of the previous turn, which was sampled but never run, and the new observation; a
  new episode's whole prompt), left-padded to a common width. The attention mask is 0 on every pad, so each row
  reads `[pad][carried][pad][unfed][sampled]` as its own sequence without the pads;
- `generate` runs only the unfed columns on top of that cache (it slices `input_ids` by the cache's length) and
  takes position ids from the mask's cumulative sum: the unfed tokens continue where the carried ones stopped,
  whose keys were rotated (RoPE) at those very positions when they were fed. Sampling is `generate`'s own with the
  `hf` engine's arguments, so greedy turns, and the samples a seed draws, are the re-reading engine's (up to
  rounding: the logits of a cached and of a re-read token may differ in their last bits);
- each episode's new cache is cut out of `generate`'s: its carried and unfed columns and the turn's sampled
  tokens but its last kept one (the first stop token, or the token that used up its budget), which becomes the
  first unfed id of the next turn.

The log-probs are those of the untempered softmax of the logits `generate` sampled from (as
`trainer.algorithms.ppo.response_logps` computes them), taken one step at a time so that no (B, R, V) tensor is
kept. A turn then costs its decode steps, a prefill of its new tokens only, and copying the caches in and out
(`benchmarks/turn_cost.py`); in exchange each running episode holds its cache between turns, while its tools run.

Used where it is exact (`carries_kv`): the `hf` engine on a Hugging Face causal LM whose every layer attends to the
whole sequence (a sliding window's cache keeps only the window, so its columns are not the episode's tokens) and
that builds its default dynamic cache. Left out: `vllm` (its prefix cache already holds the episode across
turns), sharing one prefill between episodes that continue the same history (a batch of new episodes with the same
prompt does share it, as in the engine), and keeping caches across weight updates (an update makes them stale: a
cache lives within one rollout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.config import GenerationConfig
from trainer.modeling.shared_prompts import cache_argument, prefilled_prompts, shares_prompts
from trainer.parallel.booster import unwrap_model
from trainer.rollout.engines import (
    HFGenerateEngine,
    RolloutEngine,
    SampledResponses,
    cpu_threads,
    is_sharded,
    sampling_threads,
)


@dataclass(slots=True)
class EpisodeCache:
    """The keys and values of the tokens an episode has fed to the model, in order, without padding.

    Attributes:
        kv: (layers, 2, kv_heads, T, head_dim) keys ([:, 0]) and values ([:, 1]) of the episode's first T tokens,
            on the model's device and in its dtype.
    """

    kv: Tensor

    @property
    def num_tokens(self) -> int:
        """T, the tokens the cache covers."""
        return self.kv.shape[-2]


@dataclass(slots=True)
class CarriedTurns:
    """One turn of each episode, and the caches to carry into the next.

    Attributes:
        sampled: ids (B, R) of each turn, right-padded with the pad id after its last kept token (the first stop
            token, or the last one its budget allows); logps (B, R) each sampled token's log-prob under the
            untempered softmax, 0 on padding.
        caches: Each episode's cache of its sequence up to, not including, the turn's last kept token.
    """

    sampled: SampledResponses
    caches: list[EpisodeCache]


def carries_kv(engine: RolloutEngine) -> bool:
    """Whether `sample_next_turns` may sample with `engine` (see the module docstring for why others are left out).

    Only the `hf` engine's own `generate` is what `sample_next_turns` reproduces: an engine whose `generate` was
    replaced (a subclass, or a wrapper set on the instance, that records or changes the calls) keeps re-reading,
    so that its replacement still sees every call.
    """
    if getattr(engine.generate, "__func__", None) is not HFGenerateEngine.generate:
        return False
    policy = unwrap_model(engine.model)
    config = getattr(policy, "config", None)
    if not hasattr(policy, "generate") or config is None:
        return False
    if getattr(getattr(policy, "generation_config", None), "cache_implementation", None):
        return False  # `generate` is to build a cache of its own kind (static, offloaded, quantized)
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())


@torch.no_grad()
def sample_next_turns(engine: HFGenerateEngine, caches: Sequence[EpisodeCache | None],
                      unfed_ids: Sequence[Sequence[int]], options: GenerationConfig, *, stop_token_ids: list[int],
                      pad_token_id: int, budgets: Sequence[int] | None = None) -> CarriedTurns:
    """Sample one turn of each episode on top of its carried cache, in one `generate` call.

    Args:
        engine: An `hf` engine that `carries_kv` accepts; its model samples (in eval mode, with its threads).
        caches: Each episode's carried cache; None for an episode that has fed nothing yet.
        unfed_ids: Each episode's ids that follow its cache: at least one (the previous turn's last token).
        options: Sampling settings, as the engine takes them; `max_new_tokens` is the longest turn unless `budgets`.
        stop_token_ids: A turn ends after the first of these (EOS included).
        pad_token_id: Fills the ids after each turn's end.
        budgets: Each episode's most new tokens this turn (its rollout's token budget); None: `max_new_tokens`.

    Returns:
        The turns (ids and log-probs, as the engines return them) and each episode's cache to carry.

    Raises:
        ValueError: The inputs disagree in length, an episode has no unfed id, or a budget is below 1.
    """
    budgets = [options.max_new_tokens] * len(caches) if budgets is None else list(budgets)
    if not len(caches) == len(unfed_ids) == len(budgets) or not caches:
        raise ValueError(f"sample_next_turns: {len(caches)} caches, {len(unfed_ids)} unfed id lists and {len(budgets)} "
                         "budgets, expected as many of each and at least one")
    if any(not ids for ids in unfed_ids) or min(budgets) < 1:
        raise ValueError("sample_next_turns: every episode needs at least one unfed id and a budget of at least 1")
    policy = unwrap_model(engine.model)
    was_training = policy.training
    policy.eval()
    try:
        threads = sampling_threads(engine.num_threads, len(caches))
        device = next(policy.parameters()).device
        # the copies in and out too: on a busy CPU a second thread's wake-up costs more than these small copies save
        with cpu_threads(threads if device.type == "cpu" else None):
            layout = EpisodeBatch.build(caches, unfed_ids, pad_token_id, device)
            with _finite_probabilities():
                generated, logps, cache = _generate(policy, layout, options, stop_token_ids, pad_token_id,
                                                    max(budgets))
            lengths = kept_lengths(generated, stop_token_ids, budgets)  # (B,)
            carried = layout.cut(cache, lengths.tolist())
    finally:
        policy.train(was_training)
    kept = torch.arange(generated.shape[1], device=generated.device) < lengths[:, None]  # (B, R)
    sampled = SampledResponses(generated.masked_fill(~kept, pad_token_id), logps.masked_fill(~kept, 0.0))
    return CarriedTurns(sampled, carried)


@dataclass(slots=True)
class EpisodeBatch:
    """The layout of one `generate` call: row i is `[pad][carried_i][pad][unfed_i]`, then the sampled tokens.

    Attributes:
        input_ids, attention_mask: (B, C + U) the carried columns (pad ids: `generate` does not run them) and the
            unfed ones, C the longest carried cache, U the most unfed ids.
        cache: The carried keys and values as `generate` takes them; None when no episode carries any.
        carried, unfed: (B,) each row's carried tokens and unfed ids.
    """

    input_ids: Tensor
    attention_mask: Tensor
    cache: object | None
    carried: list[int]
    unfed: list[int]

    @classmethod
    def build(cls, caches: Sequence[EpisodeCache | None], unfed_ids: Sequence[Sequence[int]], pad_token_id: int,
              device: torch.device) -> EpisodeBatch:
        carried = [cache.num_tokens if cache is not None else 0 for cache in caches]
        unfed = [len(ids) for ids in unfed_ids]
        width, tail = max(carried), max(unfed)
        column = torch.arange(width + tail)  # (C + U,)
        is_carried = (column >= width - torch.tensor(carried)[:, None]) & (column < width)  # (B, C + U)
        is_unfed = column >= width + tail - torch.tensor(unfed)[:, None]  # (B, C + U)
        input_ids = torch.full(is_unfed.shape, pad_token_id, dtype=torch.long)
        input_ids[is_unfed] = torch.tensor([token for ids in unfed_ids for token in ids])  # row by row, as the mask
        attention_mask = (is_carried | is_unfed).long()
        return cls(input_ids.to(device), attention_mask.to(device), batched_cache(caches, width), carried, unfed)

    def cut(self, cache: object, lengths: list[int]) -> list[EpisodeCache]:
        """Each row's columns of `generate`'s final cache, up to (not including) its last kept token.

        Args:
            cache: The cache `generate` returned: (B, kv_heads, C + U + R', head_dim) per layer.
            lengths: Each row's kept turn length, at least 1.
        """
        layers = [entry[:2] for entry in cache]
        rows, heads, columns, head_dim = layers[0][0].shape
        device = layers[0][0].device
        width, tail = max(self.carried), max(self.unfed)
        carried = torch.tensor(self.carried, device=device)[:, None]  # (B, 1)
        unfed = torch.tensor(self.unfed, device=device)[:, None]  # (B, 1)
        totals = carried + unfed + torch.tensor(lengths, device=device)[:, None] - 1  # (B, 1) each new cache's length
        position = torch.arange(int(totals.max()), device=device)  # (T,) a token's place in its episode's sequence
        # a row's carried tokens, then its unfed and sampled ones; past the row's end, any column (cut off below)
        picked = torch.where(position < carried, width - carried + position, width + tail - unfed + position - carried)
        picked = torch.where(position < totals, picked, 0)  # (B, T)
        # One index_select per layer's keys (and values), over their (B * kv_heads * columns, head_dim) rows: on the
        # CPU a gather with an expanded index took several times as long.
        row_start = (torch.arange(rows * heads, device=device) * columns).view(rows, heads, 1)  # (B, kv_heads, 1)
        index = (row_start + picked[:, None, :]).reshape(-1)  # (B * kv_heads * T,)
        gathered = layers[0][0].new_empty(len(layers), 2, len(index), head_dim)
        for layer, pair in enumerate(layers):
            for part, states in enumerate(pair):
                torch.index_select(states.reshape(-1, head_dim), 0, index, out=gathered[layer, part])
        gathered = gathered.view(len(layers), 2, rows, heads, len(position), head_dim)
        # each episode gets its own copy, so that a long-running episode does not keep the whole batch's alive
        return [EpisodeCache(gathered[:, :, row, :, :total].clone()) for row, total in enumerate(totals[:, 0].tolist())]


def batched_cache(caches: Sequence[EpisodeCache | None], width: int) -> object | None:
    """The episodes' caches left-padded to `width` columns as one Hugging Face `DynamicCache`; None when all are
    None or empty (the pad columns hold zeros, which the attention mask hides)."""
    present = [cache.kv for cache in caches if cache is not None and cache.num_tokens]
    if not present:
        return None
    from transformers import DynamicCache

    lengths = torch.tensor([cache.num_tokens if cache is not None else 0 for cache in caches])  # (B,)
    # every carried token side by side, then one zero column that every pad column reads
    tokens = torch.cat([*present, present[0].new_zeros(*present[0].shape[:3], 1, present[0].shape[4])], dim=3)
    pad = tokens.shape[3] - 1
    ends = lengths.cumsum(0)[:, None]  # (B, 1) where each row's tokens end in `tokens`
    column = torch.arange(width)  # (C,)
    source = torch.where(column >= width - lengths[:, None], ends - width + column, pad)  # (B, C)
    batch = tokens.index_select(3, source.reshape(-1).to(tokens.device))  # (layers, 2, kv_heads, B * C, head_dim)
    batch = batch.unflatten(3, (len(caches), width)).transpose(2, 3)  # (layers, 2, B, kv_heads, C, head_dim)
    # Positional, not by keyword: transformers 5 calls it `ddp_cache_data`, 4.x `_distributed_cache_data`.
    return DynamicCache([(batch[layer, 0], batch[layer, 1]) for layer in range(len(batch))])


def kept_lengths(generated: Tensor, stop_token_ids: list[int], budgets: Sequence[int]) -> Tensor:
    """(B,) each turn's kept length: up to and including its first stop token, at most its budget.

    Args:
        generated: (B, R) the ids `generate` sampled (R at least every row's budget, or every row stopped).
        stop_token_ids: The ids that end a turn.
        budgets: Each row's most new tokens.
    """
    limits = torch.tensor(list(budgets), device=generated.device).clamp(max=generated.shape[1])  # (B,)
    is_stop = torch.isin(generated, torch.tensor(stop_token_ids, device=generated.device))  # (B, R)
    first_stop = torch.where(is_stop.any(-1), is_stop.long().argmax(-1) + 1, generated.shape[1])  # (B,)
    return torch.minimum(first_stop, limits)


def _generate(policy: nn.Module, layout: EpisodeBatch, options: GenerationConfig, stop_token_ids: list[int],
              pad_token_id: int, max_new_tokens: int) -> tuple[Tensor, Tensor, object]:
    """`generate` on the layout, as the `hf` engine calls it: the sampled ids (B, R), their log-probs (B, R) and the
    final cache."""
    from transformers import StoppingCriteriaList

    name = cache_argument(policy)
    if layout.cache is not None:
        carried = {name: layout.cache}
    elif shares_prompts(policy):  # no episode carries anything yet: rows with the same prompt share its prefill
        carried = prefilled_prompts(policy, layout.input_ids, layout.attention_mask)
    else:
        carried = {}
    recorder = SampledTokenLogps()
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy  # PEFT: the model that runs
    hook = base.register_forward_hook(recorder.keep_logits)
    try:
        output = policy.generate(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                                 max_new_tokens=max_new_tokens, eos_token_id=stop_token_ids,
                                 pad_token_id=pad_token_id, use_cache=True, synced_gpus=is_sharded(policy),
                                 return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([recorder]),
                                 **sampling_arguments(options), **carried)
    finally:
        hook.remove()
    generated = output.sequences[:, layout.input_ids.shape[1]:]  # (B, R)
    logps = torch.stack(recorder.steps[:generated.shape[1]], dim=1)  # (B, R): steps undone at the end are dropped
    return generated, logps, getattr(output, name)


def sampling_arguments(options: GenerationConfig) -> dict:
    """The sampling arguments the `hf` engine gives `generate` (HFGenerateEngine.generate)."""
    if options.temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": options.temperature, "top_p": options.top_p,
            "top_k": options.top_k or None}


class SampledTokenLogps:
    """Each decode step's log-prob of the token `generate` just sampled, under the untempered softmax.

    A forward hook keeps the last column of the latest forward's logits (what `generate` samples from, before
    temperature and top-k/top-p); `generate` calls the instance as a stopping criterion right after it appended the
    sampled token, which is then gathered. Only one step's (B, V) logits are held, never (B, R, V).
    """

    def __init__(self) -> None:
        self.logits: Tensor | None = None
        self.steps: list[Tensor] = []

    def keep_logits(self, module: nn.Module, args: tuple, output) -> None:
        self.logits = output.logits[:, -1]  # (B, V)

    def __call__(self, input_ids: Tensor, scores: Tensor | None, **kwargs) -> Tensor:
        logps = self.logits.float().log_softmax(-1)  # (B, V)
        self.steps.append(logps.gather(-1, input_ids[:, -1:]).squeeze(-1))  # (B,)
        return torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)  # never stops a row


@contextlib.contextmanager
def _finite_probabilities() -> Iterator[None]:
    """Turns `torch.multinomial`'s error on NaN/inf probabilities into the `hf` engine's message."""
    try:
        yield
    except RuntimeError as err:
        if "inf" not in str(err) and "nan" not in str(err):
            raise
        from trainer.errors import TrainingError

        raise TrainingError("the policy's next-token probabilities are not finite (NaN/inf) while sampling "
                            "responses: the actor diverged; lower optimizer.lr or check the reward") from err
