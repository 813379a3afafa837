"""`build_rollout` builds every rollout: single-turn without an agent, multi-turn with one, `auto` chosen once;
and what every rollout does (`collect`, `with_generation`, `sync_weights`, `close`)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from trainer.config import GenerationConfig, RolloutConfig
from trainer.config.environment import EnvironmentConfig
from trainer.modeling.models import load_tokenizer
from trainer.rollout.builder import build_agent, build_rollout
from trainer.rollout.engines import HFGenerateEngine
from trainer.rollout.multi_turn import MultiTurnRollout
from trainer.rollout.scoring import RowScorer
from trainer.rollout.single_turn import SingleTurnRollout
from trainer.tracking.timing import PhaseTimer

CPU = torch.device("cpu")
GENERATION = GenerationConfig(max_new_tokens=3, temperature=0.0)


class LengthScorer(RowScorer):
    """Each response's length in characters."""

    def score(self, prompts, completions, answers):
        return [float(len(c)) for c in completions]


def build(tiny_model, settings, agent=None):
    tokenizer = load_tokenizer(str(tiny_model))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    rollout = build_rollout(settings, policy=policy, tokenizer=tokenizer, generation=GENERATION,
                            scorer=LengthScorer(), device=CPU, rows_per_call=4, agent=agent)
    return rollout, policy, tokenizer


def test_auto_is_chosen_once_and_the_hf_engine_samples_with_the_policy(tiny_model):
    rollout, policy, _ = build(tiny_model, RolloutConfig(engine="auto", num_threads=1))
    assert isinstance(rollout, SingleTurnRollout)
    assert rollout.settings.engine == "hf" and rollout.settings.num_threads == 1  # vLLM is not installed here
    assert isinstance(rollout.engine, HFGenerateEngine) and rollout.engine.model is policy


def test_collect_samples_decodes_and_scores_each_row_and_times_both(tiny_model):
    rollout, _, _ = build(tiny_model, RolloutConfig())
    timer = PhaseTimer()
    scored = rollout.collect([{"prompt": "1+2="}, {"prompt": "3+4=", "answer": "7"}], timer)
    assert scored.prompts == ["1+2=", "3+4="]
    assert scored.scores.dtype == torch.float32 and scored.scores.tolist() == [float(len(r)) for r in scored.responses]
    assert scored.batch["input_ids"].shape[0] == 2 and scored.engine_logps is None  # hf gives no log-probs
    assert set(timer.seconds) >= {"generate", "score"}


def test_with_generation_shares_the_engine_and_leaves_the_rollout_as_it_was(tiny_model):
    rollout, _, _ = build(tiny_model, RolloutConfig())
    sampled = rollout.with_generation(GENERATION.model_copy(update={"temperature": 1.0}))
    assert sampled.engine is rollout.engine and sampled.generation.temperature == 1.0
    assert rollout.generation.temperature == 0.0 and type(sampled) is type(rollout)


def test_an_agent_makes_it_a_multi_turn_rollout_and_none_without_an_environment(tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    assert build_agent(None, tokenizer) is None
    agent = build_agent(EnvironmentConfig(name="tiny_calculator", max_turns=2, max_total_tokens=40), tokenizer)
    rollout, _, _ = build(tiny_model, RolloutConfig(), agent=agent)
    assert isinstance(rollout, MultiTurnRollout) and rollout.agent is agent
    scored = rollout.collect([{"prompt": [{"role": "user", "content": "2*3="}], "answer": "6"}])
    assert scored.trajectories is not None and scored.tool_calls is not None
    assert "agent/turns_per_episode" in scored.metrics


def test_a_row_scorer_returns_float32_scores_on_the_batch_device():
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    scores = LengthScorer()(batch, ["a", "b"], ["xy", "z"], [None, None])
    assert scores.dtype == torch.float32 and scores.device == batch["input_ids"].device
    assert scores.tolist() == [2.0, 1.0]
