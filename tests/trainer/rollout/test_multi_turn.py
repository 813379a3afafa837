"""Multi-turn rollouts on the tiny model with the `hf` engine: one sequence per episode, masks, limits, batching."""

import string

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.config import GenerationConfig, RolloutConfig
from trainer.config.environment import EnvironmentConfig
from trainer.data.tokenize import encode_prompt
from trainer.data.tool_calls import ObservationEncoder
from trainer.modeling.models import load_tokenizer
from trainer.rewards.functions import FunctionScorer, load_reward_function
from trainer.rollout.engines import HFGenerateEngine
from trainer.rollout.multi_turn import Agent, EpisodeError, MultiTurnRollout

ENVIRONMENTS = ("echo=tests.trainer.agents.environments:EchoEnvironment,"
                "odd=tests.trainer.agents.environments:EndsOnOddRowsEnvironment,"
                "slow=tests.trainer.agents.environments:SlowEnvironment,"
                "broken=tests.trainer.agents.environments:BrokenEnvironment")
# A random model rarely samples EOS; a fifth of the characters as stop tokens ends its turns after a few tokens.
SAMPLING = GenerationConfig(max_new_tokens=8, temperature=1.0, stop=list(string.ascii_lowercase[:20]))


class CountingEngine(HFGenerateEngine):
    """The `hf` engine, recording how many sequences each generate call samples."""

    def __init__(self, model):
        super().__init__(model)
        self.rows_per_call = []

    def generate(self, prompt_ids, prompt_mask, options, **kwargs):
        self.rows_per_call.append(prompt_ids.shape[0])
        return super().generate(prompt_ids, prompt_mask, options, **kwargs)


@pytest.fixture
def setup(tiny_model, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ENVIRONMENTS)
    tokenizer = load_tokenizer(str(tiny_model))
    engine = CountingEngine(AutoModelForCausalLM.from_pretrained(tiny_model))
    return tokenizer, engine, FunctionScorer(load_reward_function("tiny_calculator"))


def rows(count):
    return [{"prompt": [{"role": "user", "content": f"{n}*3="}], "answer": str(n)} for n in range(1, count + 1)]


def run(setup, name, count=6, generation=SAMPLING, **limits):
    tokenizer, engine, scorer = setup
    torch.manual_seed(0)
    agent = Agent(EnvironmentConfig(name=name, **limits), tokenizer)
    rollout = MultiTurnRollout(engine, agent=agent, tokenizer=tokenizer, generation=generation, device=torch.device("cpu"),
                               scorer=scorer, settings=RolloutConfig())
    return agent, rollout.collect(rows(count))


def spans(mask):
    """(start, end, value) runs of equal values in a 1-D 0/1 list."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_an_episode_is_one_sequence_of_sampled_turns_and_observation_tokens(setup):
    tokenizer = setup[0]
    agent, rollout = run(setup, "echo", max_turns=3, max_total_tokens=200)
    stops = {tokenizer.eos_token_id, *(tokenizer.convert_tokens_to_ids(c) for c in SAMPLING.stop)}
    encoder = ObservationEncoder(tokenizer)
    batch = rollout.batch
    for row in range(len(rollout.prompts)):
        real = batch["attention_mask"][row].bool()
        ids, action = batch["input_ids"][row][real].tolist(), batch["action_mask"][row][real].tolist()
        prompt, *rest = spans(action)
        assert prompt[2] == 0 and action[prompt[1]] == 1  # the prompt, then the first model turn
        turn_number = 0
        for start, end, is_model in rest:
            if is_model:
                turn_number += 1
                turn = ids[start:end]
                assert turn[-1] in stops or (end == len(ids) and batch["truncated"][row] == 1)
            else:  # the observation, tokenized on its own after the turn's sampled stop token
                stop_text = tokenizer.decode(ids[start - 1:start])
                assert ids[start:end] == encoder.ids([{"role": "user", "content": f"go {turn_number}"}], stop_text)
        assert turn_number <= 3
        assert batch["truncated"][row] == 1  # Echo never ends: every episode is cut (by max_turns or a long turn)
    assert rollout.engine_logps is None  # hf computes none; the loop computes old log-probs itself
    assert rollout.metrics["agent/truncated_fraction"] == 1.0
    # The report shows observations inside ⟦...⟧, model text as it is. These turns stopped on a letter, not on
    # the template's <|end|>, so the observation first closes the turn.
    assert any("⟦<|end|><|user|>go 1<|end|><|assistant|>⟧" in text for text in rollout.trajectories)


def test_finished_episodes_drop_out_of_the_next_generate_call(setup):
    _, rollout = run(setup, "odd", max_turns=4)
    engine = setup[1]
    turns = rollout.metrics["agent/turns_per_episode"] * 6
    assert engine.rows_per_call[0] == 6 and engine.rows_per_call[1] <= 3  # odd answers end after one turn
    assert sum(engine.rows_per_call) == turns and engine.rows_per_call == sorted(engine.rows_per_call, reverse=True)


def test_total_token_limit_cuts_and_marks_episodes(setup):
    tokenizer = setup[0]
    _, rollout = run(setup, "echo", max_turns=50, max_total_tokens=20)
    prompt_lengths = torch.tensor([len(encode_prompt(tokenizer, row["prompt"])) for row in rows(6)])
    after_prompt = rollout.batch["attention_mask"].sum(-1) - prompt_lengths  # (B,)
    assert rollout.batch["truncated"].tolist() == [1.0] * 6
    assert (after_prompt <= 20).all() and (rollout.batch["action_mask"].sum(-1) > 0).all()


def test_environment_steps_run_concurrently(setup):
    _, rollout = run(setup, "slow", max_concurrent_episodes=6)
    assert rollout.metrics["agent/environment_seconds"] < 6 * 0.3 / 2  # one after another would take 1.8 s


def test_a_raising_environment_fails_naming_it(setup):
    with pytest.raises(EpisodeError, match="environment 'broken' raised RuntimeError: bug in the environment"):
        run(setup, "broken", count=2)


@pytest.mark.parametrize("schedule", ["lockstep", "as_ready"])
def test_the_hf_engine_carries_each_episodes_cache_and_samples_what_re_reading_samples(setup, monkeypatch, schedule):
    """A plain `hf` engine carries every episode's KV cache between turns; its greedy episodes are those of
    re-reading each episode whole (forced here), tensor for tensor, under either schedule."""
    import trainer.rollout.multi_turn as multi_turn

    tokenizer, _, scorer = setup
    engine = HFGenerateEngine(setup[1].model)
    assert multi_turn.carries_kv(engine)
    greedy = SAMPLING.model_copy(update={"temperature": 0.0})
    fed = []
    carry = multi_turn.sample_next_turns

    def recording(engine, caches, unfed, *args, **kwargs):
        fed.append([len(ids) for ids in unfed])
        return carry(engine, caches, unfed, *args, **kwargs)

    monkeypatch.setattr(multi_turn, "sample_next_turns", recording)
    carried = run((tokenizer, engine, scorer), "odd", count=6, generation=greedy, max_turns=4, schedule=schedule)[1]
    monkeypatch.setattr(multi_turn, "carries_kv", lambda engine: False)
    reread = run((tokenizer, engine, scorer), "odd", count=6, generation=greedy, max_turns=4, schedule=schedule)[1]
    assert len(fed) > 1 and max(len(call) for call in fed[1:]) > 0
    # After the first turn an episode feeds its last sampled token and the observation, never its whole history.
    prompt_length = min(fed[0])
    assert all(length < prompt_length + 8 for call in fed[1:] for length in call), fed
    for key in carried.batch:
        assert torch.equal(carried.batch[key], reread.batch[key]), key
    assert torch.equal(carried.scores, reread.scores) and carried.engine_logps is None
