"""When an agent rollout's episodes take their turns: the schedules of `environment.schedule`.

A schedule decides which episodes each generate call samples and when the environments answer; it
never looks inside a turn. `trainer.rollout.multi_turn` owns the rest (what a model turn keeps, the
limits, what an observation appends, the batch) and hands it over as `EpisodeActions`.

- `lockstep` (the default): every running episode's turn in one generate call, then every
  environment answers, and the next call waits for the slowest of them. Each generate call's rows
  are fixed by the rows alone, so sampling draws the same random numbers on every run (resume is
  bit-identical), but the engine idles while the slowest tool runs.
- `as_ready`: an episode asks for its next turn as soon as its observation is ready. The loop
  samples every episode that is ready in one generate call (the engine batches whatever is
  ready), hands each sampled turn's `step` to the thread pool at once, so tools run while the next
  call samples, and waits for the first environment to finish only when no episode is ready (and for the
  answers that follow within `GATHER_SECONDS` of each other: `gather_answers`). Which
  episodes share a call depends on when tools finish, so with temperature sampling the random draws,
  and so the episodes, differ from run to run; greedy decoding with deterministic environments
  gives lockstep's episodes.

Both run environment steps on one bounded thread pool and only there; the model's turns, the
observations' tokens and the episode bookkeeping stay on the calling thread. Per-episode state an
engine might carry between turns (a KV cache) belongs on the episode, which both schedules pass
whole to `sample_turns`; nothing here would change for it.

With an engine that batches continuously (`vllm`: `RolloutEngine.turn_stream`), `as_ready` goes one step further
(`run_continuously`): each ready episode's turn is a request of its own, added to the engine at once and joining
the turns already being sampled at the engine's next step, and each turn is handed to its environment the step it
ends. No turn waits for another's last token, and the loop checks the environments between engine steps without
blocking. `hf`'s `generate` takes whole batches only, so there `as_ready` batches whatever is ready per call.

Over-sampling (`environment.oversample_groups`): `as_ready` may be given `is_enough`, checked after every generate
call and every answer; once it holds the schedule returns with the other episodes still running. Their steps not
started are cancelled and those running are left to finish on their pool threads, unwaited, their answers dropped
(until they end they run beyond `max_concurrent_steps`, next to the following rollout's). Lockstep takes no
`is_enough`: a turn waits for every episode anyway. The asynchronous explorer carries the episodes still running on
to its next rollout instead (`StepCarry`: the pool and the steps in flight outlive the rollout).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainer.tracking.timing import PhaseTimer

if TYPE_CHECKING:
    from trainer.agents.environment import Observation


class Episode(Protocol):
    """All a schedule reads of an episode (`trainer.rollout.multi_turn.Episode`): whether it has ended."""

    done: bool


@dataclass(frozen=True, slots=True)
class EpisodeActions:
    """What a schedule may do to episodes.

    Attributes:
        sample_turns: One model turn for each episode given, in one generate call; may end an episode
            (a turn cut by its token budget). Called on the scheduling thread.
        step: The episode's environment answers its last turn; runs on a pool thread and raises
            `EpisodeError` for an environment that failed.
        append_observation: Counts the answer and appends its tokens, or ends the episode. Called on the
            scheduling thread.
    """

    sample_turns: Callable[[list[Episode]], None]
    step: Callable[[Episode], Observation]
    append_observation: Callable[[Episode, Observation], None]


# How long the as_ready loop keeps gathering answers after one came, before it samples (`gather_answers`).
GATHER_SECONDS = 0.002


class TurnQueue(Protocol):
    """An engine that batches continuously, seen from the schedule (`trainer.rollout.multi_turn.StreamedTurns`)."""

    def __len__(self) -> int:
        """Turns being sampled."""

    def submit(self, episode: Episode) -> None:
        """Start sampling the episode's next turn."""

    def advance(self) -> list[Episode]:
        """One engine step; the episodes whose turn ended in it, each turn applied (it may end the episode)."""

    def abort(self) -> None:
        """Stop sampling every turn still in flight."""


def run_in_lockstep(episodes: list[Episode], actions: EpisodeActions, pool: ThreadPoolExecutor,
                    phases: PhaseTimer, is_enough: Callable[[], bool] | None = None) -> None:
    """Turn by turn: all running episodes sampled together, then all their environments, in row order."""
    if is_enough is not None:  # EnvironmentConfig refuses oversample_groups under lockstep
        raise ValueError("the lockstep schedule runs every episode to its end; is_enough needs as_ready")
    while running := [e for e in episodes if not e.done]:
        with phases.phase("generate"):
            actions.sample_turns(running)
        stepping = [e for e in running if not e.done]
        with phases.phase("environment"):
            answers = list(pool.map(actions.step, stepping))
        for episode, observation in zip(stepping, answers):
            actions.append_observation(episode, observation)


def run_as_ready(episodes: list[Episode], actions: EpisodeActions, pool: ThreadPoolExecutor, phases: PhaseTimer,
                 is_enough: Callable[[], bool] | None, stepping: dict[Future, Episode]) -> None:
    """Each episode's next turn as soon as its observation is ready (the module docstring).

    Phase `environment` is the time the loop waited for an environment with no episode to sample, so
    `generate` plus `environment` is the engine's busy plus idle time, as under lockstep. With `is_enough`, returns
    as soon as it holds (checked after each generate call and each answer), the other episodes left as they are.
    `stepping` (in and out): environment steps already running (carried from an earlier rollout, `StepCarry`); on
    return it holds the steps still running.
    """
    should_stop = is_enough if is_enough is not None else (lambda: False)
    position = {id(episode): row for row, episode in enumerate(episodes)}
    waiting = {id(e) for e in stepping.values()}  # carried: their environments are still answering
    ready = [e for e in episodes if not e.done and id(e) not in waiting]
    try:
        while ready or stepping:
            if ready:
                ready.sort(key=lambda e: position[id(e)])  # the same readiness gives the same generate call
                with phases.phase("generate"):
                    actions.sample_turns(ready)
                # Every sampled turn is handed to its environment before returning: an episode carried on must not
                # take another turn before its environment answered this one.
                stepping.update((pool.submit(actions.step, e), e) for e in ready if not e.done)
                ready = []
                if should_stop():  # turns cut by their budget may complete what was needed
                    return
            if not stepping:
                continue
            with phases.phase("environment"):  # every step that finished during the call, or else the first to finish
                finished = gather_answers(stepping)
            if take_answers(finished, stepping, position, actions, ready, should_stop):
                return
    except BaseException:
        cancel(stepping)
        raise


def take_answers(finished: set[Future] | list[Future], stepping: dict[Future, Episode], position: dict[int, int],
                 actions: EpisodeActions, ready: list[Episode], should_stop: Callable[[], bool]) -> bool:
    """Append the observations of the `finished` steps in row order; the episodes going on join `ready`. True as
    soon as `should_stop` holds after an episode ended (the rest stay in `stepping`)."""
    for future in sorted(finished, key=lambda f: position[id(stepping[f])]):
        episode = stepping.pop(future)
        actions.append_observation(episode, future.result())  # an environment's EpisodeError ends the run
        if not episode.done:
            ready.append(episode)
        elif should_stop():
            return True
    return False


def gather_answers(stepping: dict[Future, Episode]) -> set[Future]:
    """The steps finished by now, or else the first to finish, with those that finish within `GATHER_SECONDS` of
    the one before.

    Fast tools (a calculator: microseconds) hand the pool's threads their steps one after another, and the first
    answer wakes the loop before the rest have run: sampling at once would give a cascade of generate calls of a
    row or two each, every one paying a call's fixed cost. Answers that come in quick succession join one call
    instead; a slow tool's tail costs the loop at most `GATHER_SECONDS` per call.
    """
    finished, running = wait(stepping, return_when=FIRST_COMPLETED)
    while running:
        more, running = wait(running, timeout=GATHER_SECONDS, return_when=FIRST_COMPLETED)
        if not more:
            break
        finished |= more
    return finished


def run_continuously(episodes: list[Episode], actions: EpisodeActions, turns: TurnQueue, pool: ThreadPoolExecutor,
                     phases: PhaseTimer, is_enough: Callable[[], bool] | None,
                     stepping: dict[Future, Episode]) -> None:
    """`as_ready` on an engine that batches continuously (the module docstring): turns submitted one at a time, the
    engine stepped while any is in flight, environments answered between its steps.

    Phase `generate` is the time inside engine steps and `environment` the time the loop waited for an environment
    with no turn in flight, so their sum is the engine's busy plus idle time, as in the other schedules.
    `is_enough` and `stepping` as in `run_as_ready`; turns still in flight on return are aborted (their episodes
    sample that turn again if they are carried on).
    """
    should_stop = is_enough if is_enough is not None else (lambda: False)
    position = {id(episode): row for row, episode in enumerate(episodes)}
    waiting = {id(e) for e in stepping.values()}  # carried: their environments are still answering
    ready = [e for e in episodes if not e.done and id(e) not in waiting]
    try:
        while ready or stepping or len(turns):
            for episode in sorted(ready, key=lambda e: position[id(e)]):
                turns.submit(episode)
            ready = []
            if len(turns):
                with phases.phase("generate"):
                    turned = turns.advance()
                turned.sort(key=lambda e: position[id(e)])
                stepping.update((pool.submit(actions.step, e), e) for e in turned if not e.done)  # as in run_as_ready
                if turned and should_stop():  # turns cut by their budget may complete what was needed
                    return
                finished = [future for future in stepping if future.done()]  # no waiting while turns are in flight
            elif stepping:
                with phases.phase("environment"):
                    finished, _ = wait(stepping, return_when=FIRST_COMPLETED)
            else:
                finished = []
            if take_answers(finished, stepping, position, actions, ready, should_stop):
                return
    except BaseException:
        cancel(stepping)
        raise
    finally:
        turns.abort()


def cancel(stepping: dict[Future, Episode]) -> None:
    """Steps not started yet never start (after an error, or for episodes abandoned); running ones finish unwaited."""
    for future in stepping:
        future.cancel()


class StepCarry:
    """Environment steps that outlive a rollout, for episodes carried on to the next (the asynchronous explorer,
    `MultiTurnRollout.collect`'s `carry`): one thread pool for every rollout, and the steps still running when a
    rollout returned, which the next one waits for as it would for its own.

    Args:
        max_concurrent_steps: Threads of the pool.
    """

    def __init__(self, max_concurrent_steps: int) -> None:
        self.pool = ThreadPoolExecutor(max_concurrent_steps, thread_name_prefix="environment")
        self.stepping: dict[Future, Episode] = {}

    def drop(self, episodes: list[Episode]) -> None:
        """Stop waiting for these episodes' steps (not started: cancelled; running: left to finish unwaited)."""
        gone = {id(e) for e in episodes}
        for future in [f for f, e in self.stepping.items() if id(e) in gone]:
            future.cancel()
            del self.stepping[future]

    def close(self) -> None:
        cancel(self.stepping)
        self.stepping.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_episodes(schedule: str, episodes: list[Episode], actions: EpisodeActions, *, max_concurrent_steps: int,
                 phases: PhaseTimer, is_enough: Callable[[], bool] | None = None,
                 turns: TurnQueue | None = None, carry: StepCarry | None = None) -> None:
    """Run every episode to its end under `schedule`, at most `max_concurrent_steps` environment steps at once, or
    until `is_enough` holds.

    Args:
        schedule: `lockstep` or `as_ready` (`environment.schedule`).
        episodes: Started episodes, in row order; each ends with `done` set.
        actions: What a turn and an answer do (`trainer.rollout.multi_turn`).
        max_concurrent_steps: Threads of the pool that runs environment steps (and so their tool calls).
        phases: Gets the time spent sampling (`generate`) and waiting for environments (`environment`).
        is_enough: `as_ready` only: return once this holds; episodes not `done` then are abandoned, their
            running steps left to finish unwaited (the module docstring), unless `carry` keeps them.
        turns: `as_ready` only: the engine's continuous batching, which then samples the turns one request at a
            time (`run_continuously`) instead of `actions.sample_turns`.
        carry: `as_ready` only: run on its pool, start by waiting for its steps still running (episodes carried
            from an earlier rollout, which must be among `episodes`), and leave in it the steps still running
            when `is_enough` held, instead of abandoning them.

    Raises:
        EpisodeError: An environment raised; steps not started yet are dropped.
    """
    if carry is not None and schedule != "as_ready":
        raise ValueError("carrying episodes between rollouts needs the as_ready schedule")
    pool = carry.pool if carry is not None else ThreadPoolExecutor(max_concurrent_steps,
                                                                   thread_name_prefix="environment")
    stepping = carry.stepping if carry is not None else {}
    should_wait = True  # for the steps still running after an error, as a `with` block would
    try:
        if turns is not None and schedule == "as_ready":
            run_continuously(episodes, actions, turns, pool, phases, is_enough, stepping)
        elif schedule == "as_ready":
            run_as_ready(episodes, actions, pool, phases, is_enough, stepping)
        else:
            run_in_lockstep(episodes, actions, pool, phases, is_enough)
        should_wait = all(episode.done for episode in episodes)  # not when episodes were abandoned
    finally:
        if carry is None:
            cancel(stepping)  # the abandoned episodes' steps
            pool.shutdown(wait=should_wait, cancel_futures=True)
