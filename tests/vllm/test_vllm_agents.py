"""Multi-turn episodes sampled by vLLM: the same trajectories as `hf` when greedy, under either schedule (`as_ready`
batching the turns continuously, one request each), and a GRPO stage that trains on them.

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped. The agent loop hands the
engine token-id prompts (the episode so far) and keeps the ids it sampled, so each turn after the first is a prompt
vLLM never saw as text: greedy agreement over three turns checks that nothing is re-tokenized on the way.
"""

from __future__ import annotations

import contextlib
import json
import string

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tests.conftest import make_config  # noqa: E402
from trainer.config import GenerationConfig, ModelConfig, RolloutConfig  # noqa: E402
from trainer.config.environment import EnvironmentConfig  # noqa: E402
from trainer.modeling.models import load_causal_lm, load_tokenizer  # noqa: E402
from trainer.online.stages import run_online_stage  # noqa: E402
from trainer.rewards.functions import FunctionScorer, load_reward_function  # noqa: E402
from trainer.rollout.engine_registry import build_rollout_engine  # noqa: E402
from trainer.rollout.engines import EngineSetup, HFGenerateEngine  # noqa: E402
from trainer.rollout.multi_turn import Agent, MultiTurnRollout  # noqa: E402
from trainer.rollout.vllm_engine import VLLMEngine  # noqa: E402
from trainer.tiny.agent_task import write_agent_task  # noqa: E402

CPU = torch.device("cpu")
# "go N" answers every turn (tests/trainer/agents/environments.py), so every episode lasts max_turns turns.
ECHO = "echo=tests.trainer.agents.environments:EchoEnvironment"
GREEDY = GenerationConfig(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def agent_files(tmp_path_factory):
    return write_agent_task(tmp_path_factory.mktemp("agent-task"), num_train=64, num_eval=8)


def prompt_rows(agent_files, count=8):
    return [json.loads(line) for line in agent_files["eval_prompts"].read_text().splitlines()][:count]


@pytest.fixture(scope="module")
def vllm_engine(vllm_start_model):
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model)))
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor, EngineSetup(str(vllm_start_model)))
    engine.sync_from(actor)
    yield engine
    engine.close()


class RecordingStream:
    """Wraps a `TurnStream`: for each turn submitted, how many turns were in flight then and at which engine step."""

    def __init__(self, stream):
        self.stream, self.steps, self.submits = stream, 0, []

    def __len__(self):
        return len(self.stream)

    def submit(self, *args):
        self.submits.append((self.steps, len(self.stream)))
        self.stream.submit(*args)

    def step(self):
        self.steps += 1
        return self.stream.step()

    def abort(self):
        self.stream.abort()


def test_as_ready_batches_turns_continuously_and_gives_the_greedy_episodes_of_hf(vllm_start_model, vllm_engine,
                                                                                  agent_files, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ECHO)
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model)))
    tokenizer = load_tokenizer(str(vllm_start_model))
    scorer = FunctionScorer(load_reward_function("tiny_calculator"))
    rows = prompt_rows(agent_files)
    runs, recorded = {}, []
    open_stream = vllm_engine.turn_stream

    @contextlib.contextmanager
    def recording_stream(*args, **kwargs):
        with open_stream(*args, **kwargs) as stream:
            recorded.append(RecordingStream(stream))
            yield recorded[-1]

    monkeypatch.setattr(vllm_engine, "turn_stream", recording_stream)
    monkeypatch.setattr(vllm_engine, "generate", None)  # as_ready must not sample through whole-batch calls
    for name, sampler in (("vllm", vllm_engine), ("hf", HFGenerateEngine(actor))):
        agent = Agent(EnvironmentConfig(name="echo", max_turns=3, max_total_tokens=64, schedule="as_ready"), tokenizer)
        rollout = MultiTurnRollout(sampler, agent=agent, tokenizer=tokenizer, generation=GREEDY, device=CPU,
                                   scorer=scorer, settings=RolloutConfig(engine=name))
        runs[name] = rollout.collect(rows)

    for key in ("input_ids", "attention_mask", "action_mask"):
        assert torch.equal(runs["vllm"].batch[key], runs["hf"].batch[key]), key
    assert runs["vllm"].trajectories == runs["hf"].trajectories
    stream, = recorded
    assert len(stream.submits) == 3 * len(rows)  # one request per turn
    # Turns of different lengths end at different steps, so some episode's next turn joined turns already being
    # sampled: continuous batching, not a batch waiting for its longest row.
    assert any(step > 0 and in_flight > 0 for step, in_flight in stream.submits), stream.submits
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()


def test_over_sampling_aborts_the_turns_of_the_abandoned_episodes(vllm_engine, vllm_start_model, agent_files,
                                                                  monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ECHO)
    tokenizer = load_tokenizer(str(vllm_start_model))
    agent = Agent(EnvironmentConfig(name="echo", max_turns=3, max_total_tokens=64, schedule="as_ready"), tokenizer)
    rollout = MultiTurnRollout(vllm_engine, agent=agent, tokenizer=tokenizer, generation=GREEDY, device=CPU,
                               scorer=FunctionScorer(load_reward_function("tiny_calculator")),
                               settings=RolloutConfig(engine="vllm"))
    result = rollout.collect(prompt_rows(agent_files), group_size=2, num_groups=1)
    assert result.batch["input_ids"].shape[0] == 2
    assert result.metrics["agent/abandoned_episodes"] == 6.0
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()  # their requests left the engine


def test_greedy_episodes_equal_hf_turn_for_turn(vllm_start_model, agent_files, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ECHO)
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model)))
    tokenizer = load_tokenizer(str(vllm_start_model))
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor, EngineSetup(str(vllm_start_model)))
    assert isinstance(engine, VLLMEngine)
    scorer = FunctionScorer(load_reward_function("tiny_calculator"))
    rows = prompt_rows(agent_files)
    try:
        engine.sync_from(actor)
        episodes = {}
        for name, sampler in (("vllm", engine), ("hf", HFGenerateEngine(actor))):
            agent = Agent(EnvironmentConfig(name="echo", max_turns=3, max_total_tokens=64), tokenizer)
            rollout = MultiTurnRollout(sampler, agent=agent, tokenizer=tokenizer, generation=GREEDY, device=CPU,
                                       scorer=scorer, settings=RolloutConfig(engine=name))
            episodes[name] = rollout.collect(rows)
    finally:
        engine.close()

    vllm_run, hf_run = episodes["vllm"], episodes["hf"]
    for key in ("input_ids", "attention_mask", "action_mask"):
        assert torch.equal(vllm_run.batch[key], hf_run.batch[key]), key
    assert vllm_run.trajectories == hf_run.trajectories
    assert vllm_run.metrics["agent/turns_per_episode"] == 3.0  # three turns, two observations between them
    assert all(text.count("⟦") == 2 for text in vllm_run.trajectories), vllm_run.trajectories
    assert vllm_run.engine_logps is not None and hf_run.engine_logps is None  # the log-probs are vLLM's own


@pytest.mark.parametrize("schedule", ["lockstep", "as_ready"])
def test_multi_turn_grpo_samples_with_vllm_and_trains_on_the_episodes(tmp_path, vllm_tiny_model, agent_files,
                                                                      monkeypatch, schedule):
    # The untrained model: its turns end at a stop character after a few tokens, so the last turns' lengths (and
    # with them this reward) differ between an episode's samples; episodes in `echo` last two turns
    # unless their token budget ends them first.
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ECHO)
    monkeypatch.setenv("ALIGNFLOW_REWARD_FUNCTIONS", "shorter=tests.trainer.agents.environments:shorter_answers")
    config = make_config("grpo", tmp_path / "run", vllm_tiny_model, agent_files["prompts"],
                         optimizer={"lr": 1e-3, "warmup_steps": 0, "scheduler": "constant"},
                         train={"micro_batch_size": 16}, data={"max_length": 32},
                         generation={"max_new_tokens": 8, "temperature": 1.0, "stop": list(string.ascii_lowercase[:20])},
                         reward={"function": "shorter"}, rollout={"engine": "vllm"},
                         environment={"name": "echo", "max_turns": 2, "max_total_tokens": 32, "schedule": schedule},
                         grpo={"num_episodes": 2, "rollout_batch_size": 4, "num_generations": 4, "mini_batch_size": 16})
    run_online_stage(config)

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    episodes = [line for line in lines if "agent/turns_per_episode" in line]
    assert len(episodes) == 2 and all(1.0 < line["agent/turns_per_episode"] <= 2.0 for line in episodes), lines
    assert all(line["rewards/shorter/std"] > 0 for line in episodes), lines  # something to learn from
    # The correction (on with vllm) weighed the episodes by vLLM's own log-probs of the model's tokens, in the
    # update's forward (one minibatch an episode: exactly on-policy).
    corrections = [line for line in lines if "rollout_correction/kl" in line]
    assert len(corrections) == 2 and all(abs(line["rollout_correction/kl"]) < 1e-4 for line in corrections), lines
    start, trained = (load_file(path / "model.safetensors") for path in (vllm_tiny_model, tmp_path / "run" / "model"))
    assert any(not torch.equal(start[name], trained[name]) for name in start)  # the episodes were trained on


def test_the_explorer_carries_episodes_across_weight_versions_with_vllms_own_log_probs(tmp_path, vllm_tiny_model,
                                                                                      agent_files, monkeypatch):
    # As tests/trainer/agents/test_training.py's carry test, with vLLM sampling: the carried group's first turn keeps
    # the log-probs vLLM gave under version 0, its second turn gets vLLM's under version 1.
    from tests.trainer.agents.carry import GATED, carry_config, run_carried_batches
    from trainer.algorithms.ppo import response_logps
    from trainer.asynchronous.buffer import QueueBuffer
    from trainer.asynchronous.explorer import Explorer

    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", GATED)
    config = carry_config(tmp_path / "run", vllm_tiny_model, agent_files["prompts"], rollout={"engine": "vllm"})
    explorer = Explorer(config, buffer=QueueBuffer())
    try:
        run = run_carried_batches(explorer, monkeypatch)
    finally:
        explorer.close()
    second = run.second
    assert second.version == 0 and second.info["agent/carried_episodes"] == 2.0
    start = second.input_ids.shape[1] - max(len(e.ids) for e in run.carried)  # where the prompts end
    now = response_logps(explorer.policy, second.as_batch()) * second.action_mask
    for row, (ids, values) in enumerate(zip(run.turn_one, run.recorded)):
        old = slice(start, start + len(ids))
        assert second.input_ids[row, old].tolist() == ids
        assert torch.equal(second.behaviour_logps[row, old], torch.tensor(values))  # vLLM's, under version 0
        assert not torch.allclose(now[row, old], torch.tensor(values), atol=1e-3)
        new = slice(start + len(ids), second.input_ids.shape[1])
        assert torch.allclose(second.behaviour_logps[row, new], now[row, new], atol=1e-3)  # vLLM's, version 1
