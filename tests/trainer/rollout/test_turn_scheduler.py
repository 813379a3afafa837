"""The schedules of a multi-turn rollout's turns (`environment.schedule`), on the tiny model with the `hf` engine."""

import string
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.trainer.agents.environments import ConcurrencyGauge, Latch
from trainer.config import GenerationConfig, RolloutConfig
from trainer.config.environment import EnvironmentConfig
from trainer.config.loading import build_config
from trainer.errors import ConfigError
from trainer.modeling.models import load_tokenizer
from trainer.rewards.functions import FunctionScorer, load_reward_function
from trainer.rollout.engines import HFGenerateEngine
from trainer.rollout.multi_turn import Agent, CompleteGroups, EpisodeError, MultiTurnRollout, concurrent_steps
from trainer.rollout.turn_scheduler import EpisodeActions, run_episodes
from trainer.tracking.timing import PhaseTimer

ENVIRONMENTS = ("scripted=tests.trainer.agents.environments:ScriptedEnvironment,"
                "one_at_a_time=tests.trainer.agents.environments:OneStepAtATimeEnvironment")
# Greedy, so that both schedules must give the same episodes; most printable characters stop a turn, so the random
# model's turns end after a few tokens, as tool calls would.
GREEDY = GenerationConfig(max_new_tokens=8, temperature=0.0, stop=list(string.ascii_letters + string.digits))


class RecordingEngine(HFGenerateEngine):
    """The `hf` engine, recording each generate call's (start, end) monotonic time and rows."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = []

    def generate(self, prompt_ids, prompt_mask, options, **kwargs):
        start = time.monotonic()
        out = super().generate(prompt_ids, prompt_mask, options, **kwargs)
        self.calls.append((start, time.monotonic(), prompt_ids.shape[0]))
        return out


@pytest.fixture
def setup(tiny_model, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", ENVIRONMENTS)
    tokenizer = load_tokenizer(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    return tokenizer, (lambda: RecordingEngine(model)), FunctionScorer(load_reward_function("tiny_calculator"))


def rows(count, **columns):
    """Prompt rows `n*3=`, n = 1..count, each with `columns` (a list gives one value per row)."""
    return [{"prompt": [{"role": "user", "content": f"{n}*3="}], "answer": str(n),
             **{key: value[n - 1] if isinstance(value, list) else value for key, value in columns.items()}}
            for n in range(1, count + 1)]


def run(setup, schedule, prompt_rows, name="scripted", generation=GREEDY, groups=None, **limits):
    tokenizer, build_engine, scorer = setup
    engine = build_engine()
    torch.manual_seed(0)
    agent = Agent(EnvironmentConfig(name=name, schedule=schedule, **{"max_turns": 8, **limits}), tokenizer)
    rollout = MultiTurnRollout(engine, agent=agent, tokenizer=tokenizer, generation=generation, device=torch.device("cpu"),
                               scorer=scorer, settings=RolloutConfig())
    return rollout.collect(prompt_rows, **(groups or {})), engine.calls


def test_as_ready_gives_lockstep_episodes_under_greedy_decoding(setup):
    turns = [3, 1, 4, 2, 1, 3]
    # Row 1's tools are slow and row 3's fast, so episodes finish out of row order and share calls differently.
    sleeps = [[0.12] * 4, [0.0] * 4, [0.0] * 4, [0.04] * 4, [0.08] * 4, [0.0] * 4]
    lockstep, lockstep_calls = run(setup, "lockstep", rows(6, turns=turns, sleeps=sleeps))
    as_ready, as_ready_calls = run(setup, "as_ready", rows(6, turns=turns, sleeps=sleeps))
    assert [rows for *_, rows in as_ready_calls] != [rows for *_, rows in lockstep_calls]  # other batches
    assert lockstep.batch.keys() == as_ready.batch.keys()
    for key, tensor in lockstep.batch.items():  # prompts left-padded, action mask on model tokens, row order
        assert torch.equal(tensor, as_ready.batch[key]), key
    assert torch.equal(lockstep.scores, as_ready.scores)
    assert lockstep.trajectories == as_ready.trajectories and lockstep.prompts == as_ready.prompts
    assert as_ready.prompts == [str(row["prompt"]) for row in rows(6)]
    finished = as_ready.batch["truncated"] == 0
    assert finished.any()  # else the scripted turn counts were never reached and nothing here is tested
    model_turns = [t.count("⟦") + 1 for t in as_ready.trajectories]
    assert [n for n, done in zip(model_turns, finished) if done] == [n for n, done in zip(turns, finished) if done]


def test_a_slow_tool_does_not_hold_the_other_episodes(setup):
    # Row 1's first step waits until every other episode has ended, which only a schedule that samples the others'
    # turns while that step runs lets happen: the overlap is proved by the order of events, not by a time bound.
    others = 4
    prompt_rows = rows(1 + others, turns=[1] + [3] * others, waits_for_others=[True] + [False] * others,
                       latch=Latch(others))
    rollout, calls = run(setup, "as_ready", prompt_rows, max_concurrent_episodes=1 + others)
    slow = prompt_rows[0]
    assert slow["released"]
    (slow_start, slow_end), = slow["steps"]
    during_slow_step = [call for call in calls if slow_start < call[0] and call[1] < slow_end]
    assert len(during_slow_step) >= 2  # the others' second and third turns at least
    assert rollout.batch["truncated"].tolist() == [0.0] * (1 + others)


@pytest.mark.parametrize("schedule", ["lockstep", "as_ready"])
def test_environment_steps_stay_within_the_concurrency_bound(setup, schedule):
    gauge = ConcurrencyGauge()
    run(setup, schedule, rows(6, turns=2, sleeps=[[0.05, 0.05]] * 6, gauge=gauge), max_concurrent_episodes=2)
    assert gauge.peak == 2
    gauge = ConcurrencyGauge()
    run(setup, schedule, rows(4, sleeps=[[0.02]] * 4, gauge=gauge), name="one_at_a_time", max_concurrent_episodes=4)
    assert gauge.peak == 1  # the environment's own `max_concurrent_steps`


def test_an_environment_error_names_its_row_under_as_ready(setup):
    with pytest.raises(EpisodeError, match=r"environment 'scripted' raised RuntimeError: scripted failure at turn 2 "
                                           r"on the row with prompt .*3\*3="):
        run(setup, "as_ready", rows(5, turns=3, fails_at_turn=[None, None, 2, None, None]))


def test_an_environment_own_concurrency_limit_must_be_positive():
    class Unlimited:
        max_concurrent_steps = 0

    with pytest.raises(ConfigError, match="sets max_concurrent_steps = 0, expected a positive integer"):
        concurrent_steps(EnvironmentConfig(name="scripted"), Unlimited)


# -- over-sampling (`environment.oversample_groups`) -----------------------------------------------------------------


def test_over_sampling_returns_the_complete_groups_without_waiting_for_the_slow_one(setup):
    # Four groups of two rows, three needed. Row 2's first step waits on a gate this test opens only after `collect`
    # returned, so its group (rows 2-3) cannot complete in time: returning at all proves nothing waited for it.
    gate = threading.Event()
    turns = [2, 1, 1, 1, 3, 2, 1, 2]
    prompt_rows = rows(8, turns=turns, gate=[None, None, gate] + [None] * 5)
    try:
        rollout, _ = run(setup, "as_ready", prompt_rows, groups={"group_size": 2, "num_groups": 3},
                         max_concurrent_episodes=8)
        assert "steps" not in prompt_rows[2]  # its step is still waiting: the rollout did not
    finally:
        gate.set()
    kept = [0, 1, 4, 5, 6, 7]  # whole groups, in row order
    assert rollout.prompts == [str(prompt_rows[row]["prompt"]) for row in kept]
    assert rollout.batch["input_ids"].shape[0] == len(rollout.scores) == len(rollout.trajectories) == 6
    assert rollout.batch["truncated"].tolist() == [0.0] * 6
    model_turns = [t.count("⟦") + 1 for t in rollout.trajectories]
    assert model_turns == [turns[row] for row in kept]
    metrics = rollout.metrics  # of the returned episodes only
    assert metrics["agent/turns_per_episode"] == sum(turns[row] for row in kept) / 6
    assert metrics["agent/abandoned_episodes"] == 2.0
    assert len(rollout.tool_calls) == 6
    deadline = time.monotonic() + 10  # the abandoned step finishes on its pool thread, unwaited
    while "steps" not in prompt_rows[2] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "steps" in prompt_rows[2]


def test_over_sampling_keeps_the_complete_groups_in_row_order_whatever_order_they_completed_in(setup):
    # Group 1 completes first, then group 0; group 2 last. (Steps that end together may be seen in any order, so
    # the order of completion is set by the sleeps, with margins far above a step's own time.)
    sleeps = [[0.15], [0.15], [0.0], [0.0], [0.6], [0.6]]
    rollout, _ = run(setup, "as_ready", rows(6, turns=1, sleeps=sleeps), groups={"group_size": 2, "num_groups": 2})
    assert rollout.prompts == [str(row["prompt"]) for row in rows(4)]
    assert rollout.metrics["agent/abandoned_episodes"] == 2.0


def test_complete_groups_are_whole_groups_of_ended_episodes():
    episodes = [SimpleNamespace(done=done) for done in [True, False, True, True, True, True]]
    groups = CompleteGroups(6, 2, 1)
    assert groups.complete(episodes) == [1, 2] and groups.is_enough(episodes)
    assert groups.kept_rows(episodes) == [2, 3]
    assert CompleteGroups(6, 2, None).kept_rows([SimpleNamespace(done=True)] * 6) == list(range(6))
    with pytest.raises(ValueError, match="not whole groups of 4"):
        CompleteGroups(6, 4, 1)
    with pytest.raises(ValueError, match="4 groups needed of the 3 given"):
        CompleteGroups(6, 2, 4)


def test_lockstep_takes_no_stopping_condition():
    actions = EpisodeActions(lambda episodes: None, lambda episode: None, lambda episode, observation: None)
    with pytest.raises(ValueError, match="is_enough needs as_ready"):
        run_episodes("lockstep", [SimpleNamespace(done=False)], actions, max_concurrent_steps=1, phases=PhaseTimer(),
                     is_enough=lambda: True)


def test_over_sampling_needs_the_as_ready_schedule_and_a_count_of_at_least_zero(tmp_path):
    base = {"output_dir": str(tmp_path), "model": {"path": str(tmp_path)}, "data": {"train_path": str(tmp_path)},
            "reward": {"function": "tiny_calculator"}}
    with pytest.raises(ConfigError, match=r"environment.oversample_groups is 2, expected: 0 under schedule 'lockstep'; "
                                          r"over-sampling needs environment.schedule: as_ready"):
        build_config("grpo", {**base, "environment": {"name": "scripted", "oversample_groups": 2}})
    with pytest.raises(ConfigError, match="environment.oversample_groups is -1, expected: .*greater than or equal to 0"):
        build_config("grpo", {**base, "environment": {"name": "scripted", "schedule": "as_ready",
                                                      "oversample_groups": -1}})
    config = build_config("grpo", {**base, "environment": {"name": "scripted", "schedule": "as_ready",
                                                           "oversample_groups": 2}})
    assert config.environment.oversample_groups == 2


# -- continuous batching (an engine with `turn_stream`: vllm, tested for real in tests/vllm) -------------------------


class StepQueue:
    """A `TurnQueue` whose turns each take a scripted number of engine steps (episode.turn_steps[turn]), as turns of
    different lengths do; records each submission's (engine step, turns in flight)."""

    def __init__(self):
        self.steps, self.in_flight, self.submits, self.aborted = 0, {}, [], False

    def __len__(self):
        return len(self.in_flight)

    def submit(self, episode):
        self.submits.append((self.steps, len(self.in_flight)))
        self.in_flight[id(episode)] = (episode, self.steps + episode.turn_steps[episode.turns])

    def advance(self):
        self.steps += 1
        time.sleep(0.002)  # an engine step takes time, during which environments answer
        ended = [episode for episode, due in self.in_flight.values() if due <= self.steps]
        for episode in ended:
            del self.in_flight[id(episode)]
            episode.turns += 1
        return ended

    def abort(self):
        self.aborted, self.in_flight = True, {}


def scripted_episodes(turn_steps):
    return [SimpleNamespace(done=False, turns=0, turn_steps=steps) for steps in turn_steps]


def continuous_actions(fails=None):
    def step(episode):
        if episode is fails:
            raise RuntimeError("environment failed")
        return SimpleNamespace()

    def append_observation(episode, observation):
        episode.done = episode.turns == len(episode.turn_steps)

    return EpisodeActions(lambda episodes: pytest.fail("a whole-batch call under continuous batching"), step,
                          append_observation)


def test_continuous_batching_submits_a_turn_while_others_are_sampled():
    episodes = scripted_episodes([[1, 1, 1], [6], [3, 3]])  # the short turns end, answer and come back mid-flight
    queue, phases = StepQueue(), PhaseTimer()
    run_episodes("as_ready", episodes, continuous_actions(), max_concurrent_steps=3, phases=phases, turns=queue)
    assert all(e.done and e.turns == len(e.turn_steps) for e in episodes)
    assert queue.submits[:3] == [(0, 0), (0, 1), (0, 2)]  # the first turns together
    assert any(step > 0 and in_flight > 0 for step, in_flight in queue.submits[3:]), queue.submits
    assert phases.seconds["generate"] > 0


def test_continuous_batching_stops_at_enough_and_after_an_error_with_the_turns_in_flight_aborted():
    episodes = scripted_episodes([[1], [1], [50]])
    queue = StepQueue()
    run_episodes("as_ready", episodes, continuous_actions(), max_concurrent_steps=3, phases=PhaseTimer(),
                 is_enough=lambda: episodes[0].done and episodes[1].done, turns=queue)
    assert queue.aborted and not episodes[2].done and queue.steps < 50

    episodes, queue = scripted_episodes([[1, 1], [50]]), StepQueue()
    with pytest.raises(RuntimeError, match="environment failed"):
        run_episodes("as_ready", episodes, continuous_actions(fails=episodes[0]), max_concurrent_steps=2,
                     phases=PhaseTimer(), turns=queue)
    assert queue.aborted
