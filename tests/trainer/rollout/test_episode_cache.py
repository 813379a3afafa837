"""Episodes that carry their KV cache from turn to turn (`trainer.rollout.episode_cache`) sample what re-reading the
whole episode with the `hf` engine samples, with the log-probs of a full forward, and carry exactly the keys and
values of the tokens they fed."""

from __future__ import annotations

import pytest
import torch

from trainer.config import GenerationConfig
from trainer.rollout.engines import HFGenerateEngine, RolloutEngine
from trainer.rollout.episode_cache import EpisodeCache, carries_kv, kept_lengths, sample_next_turns
from trainer.rollout.single_turn import left_pad
from trainer.tiny.model import build_tiny_llama

VOCAB, PAD, EOS = 101, 0, 2
STOPS = [EOS, *range(6, 26)]  # a fifth of the vocabulary: the random model's turns end after a few tokens, or not
BUDGETS = {0: 6, 1: 2, 2: 6, 3: 5, 4: 6}  # episode 1's budget cuts its turns before they stop
# The episodes that take turns 1, 2 and 3: episode 3 ends after turn 2; episode 4 starts at turn 2, without a cache,
# beside episodes that carry theirs.
EPISODES_BY_TURN = [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 4]]


@pytest.fixture(scope="module")
def engine() -> HFGenerateEngine:
    # 4 heads share 2 key/value heads: the cut must keep each head's own columns
    return HFGenerateEngine(build_tiny_llama(VOCAB, num_heads=4).eval(), num_threads=1)


class Episode:
    """An episode's tokens so far, its carried cache and the ids that follow the cache."""

    def __init__(self, prompt: list[int]) -> None:
        self.sequence = list(prompt)
        self.cache: EpisodeCache | None = None
        self.unfed = list(prompt)


def random_ids(generator: torch.Generator, length: int) -> list[int]:
    return torch.randint(6, VOCAB, (length,), generator=generator).tolist()


def prompts(generator: torch.Generator) -> dict[int, list[int]]:
    """Episodes 0 and 1 share a prompt (their first turn shares its prefill); episode 4's is a single token."""
    shared = random_ids(generator, 4)
    return {0: shared, 1: list(shared), 2: random_ids(generator, 11), 3: random_ids(generator, 2),
            4: random_ids(generator, 1)}


def reread_turns(engine: HFGenerateEngine, episodes: list[Episode], options: GenerationConfig,
                 budgets: list[int]) -> list[list[int]]:
    """Today's loop: every episode's whole sequence left-padded into the `hf` engine, each turn cut at its first stop
    token or its budget."""
    ids, mask = left_pad([e.sequence for e in episodes], PAD)
    sampled = engine.generate(ids, mask, options.model_copy(update={"max_new_tokens": max(budgets)}),
                              stop_token_ids=STOPS, pad_token_id=PAD)
    lengths = kept_lengths(sampled.ids, STOPS, budgets)
    return [row[:length].tolist() for row, length in zip(sampled.ids, lengths)]


def full_forward_logps(model: torch.nn.Module, sequence: list[int], turn: list[int]) -> torch.Tensor:
    """Each turn token's log-prob from one forward over the episode, its turn included (no cache, no padding)."""
    logits = model(input_ids=torch.tensor([sequence + turn])).logits[0, len(sequence) - 1:-1]  # (len(turn), V)
    return logits.log_softmax(-1).gather(-1, torch.tensor(turn)[:, None]).squeeze(-1)


def carried_turns(engine: HFGenerateEngine, episodes: list[Episode], options: GenerationConfig, budgets: list[int],
                  expected: list[list[int]]) -> list[torch.Tensor]:
    """One `sample_next_turns` call, which must sample the `expected` turns; checks the carried caches' lengths and
    moves each episode's cache forward. Returns each turn's log-probs."""
    turns = sample_next_turns(engine, [e.cache for e in episodes], [e.unfed for e in episodes], options,
                              stop_token_ids=STOPS, pad_token_id=PAD, budgets=budgets)
    ids, logps = turns.sampled.ids, turns.sampled.logps
    kept_logps = []
    for row, (episode, cache, turn) in enumerate(zip(episodes, turns.caches, expected)):
        assert ids[row, :len(turn)].tolist() == turn
        assert ids[row, len(turn):].eq(PAD).all() and logps[row, len(turn):].eq(0).all()
        # the cache covers the episode's tokens but the turn's last one, which is the next turn's first unfed id
        assert cache.num_tokens == len(episode.sequence) + len(turn) - 1
        episode.cache = cache
        kept_logps.append(logps[row, :len(turn)])
    return kept_logps


def observe(episode: Episode, turn: list[int], observation: list[int]) -> None:
    episode.sequence += turn + observation
    episode.unfed = turn[-1:] + observation


def test_greedy_turns_equal_rereading_and_logps_equal_a_full_forward(engine):
    generator = torch.Generator().manual_seed(0)
    episodes = {n: Episode(prompt) for n, prompt in prompts(generator).items()}
    options = GenerationConfig(max_new_tokens=6, temperature=0.0)
    all_turns = []
    for numbers in EPISODES_BY_TURN:
        active = [episodes[n] for n in numbers]
        budgets = [BUDGETS[n] for n in numbers]
        turns = reread_turns(engine, active, options, budgets)
        logps = carried_turns(engine, active, options, budgets, turns)
        all_turns += turns
        for episode, turn, turn_logps in zip(active, turns, logps):
            torch.testing.assert_close(turn_logps, full_forward_logps(engine.model, episode.sequence, turn),
                                       atol=1e-5, rtol=0)
        for episode, turn in zip(active, turns):
            observe(episode, turn, random_ids(generator, int(torch.randint(1, 6, (), generator=generator))))
    assert any(not set(turn) & set(STOPS) for turn in all_turns), "no turn was cut by its budget"
    assert any(set(turn) & set(STOPS) for turn in all_turns), "no turn ended on a stop token"
    for episode in episodes.values():  # the carried keys and values are those a fresh prefill of the episode gives
        fed = episode.sequence[:episode.cache.num_tokens]
        prefill = engine.model(input_ids=torch.tensor([fed]), use_cache=True)
        cache = prefill.cache if hasattr(prefill, "cache") else prefill.past_key_values
        fresh = torch.stack([torch.stack([entry[0][0], entry[1][0]]) for entry in cache])
        torch.testing.assert_close(episode.cache.kv, fresh, atol=1e-5, rtol=0)


def test_sampled_turns_end_at_their_first_stop_and_draw_what_rereading_draws(engine):
    generator = torch.Generator().manual_seed(1)
    episodes = {n: Episode(prompt) for n, prompt in prompts(generator).items()}
    options = GenerationConfig(max_new_tokens=6, temperature=0.9, top_p=0.9, top_k=30)
    for seed, numbers in enumerate(EPISODES_BY_TURN):
        active = [episodes[n] for n in numbers]
        budgets = [BUDGETS[n] for n in numbers]
        torch.manual_seed(seed)
        turns = reread_turns(engine, active, options, budgets)
        torch.manual_seed(seed)
        logps = carried_turns(engine, active, options, budgets, turns)
        for turn, turn_logps, budget in zip(turns, logps, budgets):
            assert 1 <= len(turn) <= budget
            assert not set(turn[:-1]) & set(STOPS)  # a stop token only ever ends a turn
            assert torch.isfinite(turn_logps).all() and (turn_logps <= 0).all()
        for episode, turn in zip(active, turns):
            observe(episode, turn, random_ids(generator, 3))


def test_kept_lengths_stop_at_the_first_stop_token_or_the_budget():
    generated = torch.tensor([[9, 2, 9, 2],  # stops at its first EOS
                              [9, 9, 9, 9],  # never stops: its budget
                              [9, 9, 9, 2]])  # stops after its budget: the budget
    assert kept_lengths(generated, [2], [4, 3, 2]).tolist() == [2, 3, 2]


def test_an_episode_without_unfed_ids_is_refused(engine):
    with pytest.raises(ValueError, match="at least one unfed id"):
        sample_next_turns(engine, [None], [[]], GenerationConfig(), stop_token_ids=STOPS, pad_token_id=PAD)


def test_only_the_plain_hf_engine_on_full_attention_carries_kv(engine):
    assert carries_kv(engine)

    class OtherEngine(RolloutEngine):  # vllm, say: it keeps its own prefix cache
        def generate(self, *args, **kwargs):
            raise NotImplementedError

        def sync_from(self, policy):
            pass

    assert not carries_kv(OtherEngine())

    class RecordingEngine(HFGenerateEngine):  # its generate must see every call
        def generate(self, *args, **kwargs):
            return super().generate(*args, **kwargs)

    assert not carries_kv(RecordingEngine(engine.model))
    wrapped = HFGenerateEngine(engine.model)
    wrapped.generate = lambda *args, **kwargs: None  # a benchmark's timer, say
    assert not carries_kv(wrapped)
    windowed = build_tiny_llama(VOCAB, num_heads=2)
    windowed.config.sliding_window = 4
    assert not carries_kv(HFGenerateEngine(windowed))
    static = build_tiny_llama(VOCAB, num_heads=2)
    static.generation_config.cache_implementation = "static"
    assert not carries_kv(HFGenerateEngine(static))
