"""Multi-turn rollouts: episodes in environments, one token sequence per episode.

`MultiTurnRollout.collect` returns the same `ScoredRollout` as a single-turn rollout, so every online
estimator (GRPO's, RLOO, REINFORCE++, PPO's critic) and the evaluation consume episodes unchanged.
Per turn of an episode:

1. the episode is sampled in one generate call with the others due a turn then: each one's whole
   sequence so far (prompt, model turns, observations) is a token-id prompt for
   `RolloutEngine.generate`, so any engine (`hf`, `vllm`) runs the same loop;
2. the turn keeps the ids the engine sampled, up to and including its first stop token (a turn
   without one ran out of `generation.max_new_tokens` or of the episode's token budget: truncated);
3. its environment answers (`Environment.step`) on a bounded thread pool, concurrently with other
   episodes' environments;
4. the observation is tokenized on its own (`trainer.data.tool_calls.ObservationEncoder`) and
   appended with action mask 0, unless the episode is done or cut by `max_turns`/`max_total_tokens`.

The environment's side (its class, its tools, the observation encoder, the limits) is an `Agent`,
built before any model loads (`trainer.rollout.builder.build_agent`: a code tool proves its sandbox
then); the engine's side (sampling turns, the batch) is `MultiTurnRollout`. Which episodes share a
generate call, and when the environments answer, is the schedule (`environment.schedule`,
`trainer.rollout.turn_scheduler`): all running episodes turn by turn (`lockstep`), or each episode as
soon as its observation is ready (`as_ready`). Under `as_ready`, `collect(..., num_groups=N)` returns once N groups
of consecutive rows have every episode ended and drops the rest (over-sampling, `environment.oversample_groups`), or,
given an `EpisodeCarry` (the asynchronous explorer), keeps them running for the next collect under newer weights.

The batch is laid out as a single-turn one: the prompt left-padded, everything after it
right-padded, `action_mask` 1 on the model's sampled tokens only; `truncated` marks episodes cut
by a limit (so `grpo.mask_truncated_completions` applies). With `hf`, each episode carries its KV
cache from turn to turn (`trainer.rollout.episode_cache`, where `carries_kv` says it is exact): a turn
runs only the tokens the model has not yet seen, instead of re-reading the whole episode; `vllm`'s
prefix cache holds the history itself (benchmarks/turn_cost.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from trainer.agents.environment import Environment, Observation
from trainer.agents.tools import ToolBox, as_tool, check_requirements
from trainer.allow_list import ENVIRONMENTS, TOOLS, resolve
from trainer.config import GenerationConfig, RolloutConfig
from trainer.config.environment import EnvironmentConfig
from trainer.data.tokenize import encode_prompt
from trainer.data.tool_calls import ObservationEncoder, supports_tools
from trainer.errors import AlignflowError, ConfigError
from trainer.rollout.engines import RolloutEngine
from trainer.rollout.episode_cache import EpisodeCache, carries_kv, sample_next_turns
from trainer.rollout.interface import Rollout, ScoredRollout
from trainer.rollout.scoring import Scorer
from trainer.rollout.single_turn import left_pad, positions_from_mask, stop_token_ids
from trainer.rollout.turn_scheduler import EpisodeActions, StepCarry, run_episodes
from trainer.tracking.timing import PhaseTimer


class EpisodeError(AlignflowError):
    """An environment (not a tool: those become observations) raised while answering a turn."""


@dataclass(slots=True)
class Episode:
    """One episode's sequence and counts as it grows."""

    row: dict
    environment: Environment
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # everything after the prompt
    action: list[int] = field(default_factory=list)  # 1 on the model's sampled tokens
    logps: list[float] = field(default_factory=list)  # the engine's log-probs (0 off the action mask)
    segments: list[tuple[str, bool]] = field(default_factory=list)  # (text, is_model) for reports
    last_turn: str = ""
    reward: float = 0.0
    num_turns: int = 0
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    tool_seconds: float = 0.0
    done: bool = False
    truncated: bool = False
    first_version: int = 0  # the weight version it started under (episodes carried across versions, EpisodeCarry)
    known_logps: int = 0  # how many of `ids` lead with their final behaviour log-probs in `logps` (or are not model's)
    # With `hf`: the keys and values of the first `cache.num_tokens` tokens of prompt_ids + ids (every token but
    # those fed next turn); None before the first turn and once the episode ends (its memory freed then).
    cache: EpisodeCache | None = None

    def extend(self, ids: list[int], is_model: bool, logps: list[float] | None = None) -> None:
        if self.known_logps == len(self.ids) and (logps is not None or not is_model):
            self.known_logps += len(ids)
        self.ids += ids
        self.action += [int(is_model)] * len(ids)
        self.logps += logps if logps is not None else [0.0] * len(ids)

    def end(self, truncated: bool = False) -> None:
        self.done, self.truncated, self.cache = True, truncated, None

    def unfed_ids(self) -> list[int]:
        """The tokens its carried cache does not hold yet (all of them before the first turn)."""
        fed = self.cache.num_tokens if self.cache is not None else 0
        return (self.prompt_ids + self.ids)[fed:]


class Agent:
    """The environment `config.name` with the tools it allows: starts episodes and answers their turns.

    Args:
        config: The `environment` section.
        tokenizer: Encodes prompts and observations, decodes model turns.
    """

    def __init__(self, config: EnvironmentConfig, tokenizer: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.environment_class = resolve(ENVIRONMENTS, config.name)  # refused before import if not allowed
        names = config.tools or list(getattr(self.environment_class, "default_tools", ()))
        tools = [as_tool(resolve(TOOLS, name), name) for name in names]
        for tool in tools:
            check_requirements(tool)
        self.toolbox = ToolBox(tools, config.tool_timeout_seconds, config.max_tool_output_chars)
        self.observations = ObservationEncoder(tokenizer)
        self.max_concurrent_steps = concurrent_steps(config, self.environment_class)

    def start(self, row: dict) -> Episode:
        """A new episode of `row`: its environment started, its prompt encoded (with the tools' schemas where the
        chat template takes them)."""
        environment = self.environment_class(self.toolbox)
        environment.start(row)
        if supports_tools(self.tokenizer) and self.toolbox.tools and not isinstance(row["prompt"], str):
            prompt_ids = self.tokenizer.apply_chat_template(row["prompt"], tools=self.toolbox.schemas(),
                                                            add_generation_prompt=True, tokenize=True)
        else:
            prompt_ids = row["prompt_ids"] if "prompt_ids" in row else encode_prompt(self.tokenizer, row["prompt"])
        return Episode(row, environment, list(prompt_ids))

    def step(self, episode: Episode) -> Observation:
        """The environment's answer to the episode's last turn (on a pool thread); EpisodeError if it raised."""
        try:
            return episode.environment.step(episode.last_turn)
        except Exception as err:
            raise EpisodeError(f"environment {self.config.name!r} raised {type(err).__name__}: {err} on the "
                                    f"row with prompt {str(episode.row.get('prompt'))[:60]!r}") from err

    def append_observation(self, episode: Episode, observation: Observation) -> None:
        """Count the observation and append its tokens, or end the episode (done, or cut by a limit)."""
        episode.reward += observation.reward
        episode.tool_seconds += observation.tool_seconds
        episode.num_tool_calls += observation.num_tool_calls
        episode.num_tool_errors += observation.num_tool_errors
        if observation.done:
            episode.end()
            return
        if episode.num_turns >= self.config.max_turns:
            episode.end(truncated=True)
            return
        stop_text = self.tokenizer.decode(episode.ids[-1:])
        ids = self.observations.ids(observation.messages, stop_text)
        if len(episode.ids) + len(ids) >= self.config.max_total_tokens:  # no room left for a model token
            episode.end(truncated=True)
            return
        episode.extend(ids, False)
        episode.segments.append((self.tokenizer.decode(ids), False))



class MultiTurnRollout(Rollout):
    """One episode of `agent`'s environment per row, run to its end and scored (see the module docstring).

    Args:
        engine, tokenizer, generation, device, scorer, settings: As in `Rollout`.
        agent: The environment and tools the episodes run in.

    The episode's last turn is what `scorer` scores; the environment's own rewards are added to it.
    `collect`'s timer also gets the environments' time as phase `environment`.
    """

    def __init__(self, engine: RolloutEngine, *, agent: Agent, tokenizer: Any, generation: GenerationConfig,
                 device: torch.device, scorer: Scorer, settings: RolloutConfig) -> None:
        super().__init__(engine, tokenizer=tokenizer, generation=generation, device=device, scorer=scorer,
                         settings=settings)
        self.agent = agent

    @torch.no_grad()
    def collect(self, rows: list[dict], timer: PhaseTimer | None = None, *, group_size: int = 1,
                num_groups: int | None = None, carry: EpisodeCarry | None = None) -> ScoredRollout:
        """Run an episode per row and score them (`Rollout.collect`); with `num_groups`, only the first groups to
        complete.

        Args:
            rows, timer: As in `Rollout.collect`.
            group_size: Rows come in groups of this many consecutive rows (GRPO's `num_generations`).
            num_groups: Return as soon as this many groups have every episode ended (`as_ready` only): the batch
                holds those groups' rows in row order (where more completed at once, the first in row order), and
                the other episodes are abandoned (`trainer.rollout.turn_scheduler`). None: every row.
            carry: With `num_groups`: the groups an earlier collect left unfinished run first (ahead of `rows`, so
                that the oldest complete first in row order), and this collect's unfinished groups are left in it
                for the next, instead of abandoned (`EpisodeCarry`).

        Raises:
            ValueError: `rows` are not whole groups, or fewer than `num_groups` of them.
        """
        agent = self.agent
        stops = stop_token_ids(self.tokenizer, self.generation)
        carried = carry.take(group_size) if carry is not None else []
        episodes = carried + [agent.start(row) for row in rows]
        for episode in episodes[len(carried):]:
            episode.first_version = carry.version if carry is not None else 0
        groups = CompleteGroups(len(episodes), group_size, num_groups)
        phases = PhaseTimer()  # this rollout's own, for its `agent/*` metrics
        actions = EpisodeActions(partial(self.sample_turns, stops=stops), agent.step, agent.append_observation)
        streaming = self.engine.turn_stream(self.generation, stop_token_ids=stops, num_rows=len(rows)) \
            if agent.config.schedule == "as_ready" else None
        with streaming or contextlib.nullcontext() as stream:
            run_episodes(agent.config.schedule, episodes, actions, max_concurrent_steps=agent.max_concurrent_steps,
                         phases=phases, is_enough=partial(groups.is_enough, episodes) if num_groups is not None else None,
                         turns=StreamedTurns(self, stream, episodes, stops) if stream is not None else None,
                         carry=carry.steps if carry is not None else None)
        for episode in episodes:
            episode.cache = None  # computed by these weights; an abandoned or carried episode re-reads its history
        kept_rows = groups.kept_rows(episodes)
        if carry is not None:
            kept = set(kept_rows)
            carry.keep([episode for row, episode in enumerate(episodes) if row not in kept])
        episodes = [episodes[row] for row in kept_rows]
        batch, engine_logps = self.to_batch(episodes)
        prompts = [str(e.row["prompt"]) for e in episodes]
        finals = [e.last_turn for e in episodes]
        with phases.phase("score"):
            scores = self.scorer(batch, prompts, finals, [e.row.get("answer") for e in episodes])
        scores = scores + torch.tensor([e.reward for e in episodes], dtype=scores.dtype, device=scores.device)
        trajectories = [render_trajectory(e.segments) for e in episodes]
        if timer is not None:
            timer.add(phases)
        timings = {"generate": phases.seconds["generate"], "environment": phases.seconds["environment"],
                   "tools": sum(e.tool_seconds for e in episodes)}
        metrics = episode_metrics(episodes, timings)
        if carry is None:
            metrics["agent/abandoned_episodes"] = float(len(rows) - len(episodes))
        else:
            metrics.update(carry.metrics(episodes))
        return ScoredRollout(batch, prompts, finals, scores, engine_logps, metrics=metrics,
                             trajectories=trajectories,
                             tool_calls=[(e.num_tool_calls, e.num_tool_errors) for e in episodes],
                             engine_logps_known=known_logps_mask(episodes, batch) if engine_logps is not None else None,
                             oldest_version=min(e.first_version for e in episodes) if carry is not None else None)

    def record_behaviour_logps(self, episodes: list[Episode], logps_of: Callable[[dict], torch.Tensor]) -> None:
        """Give the tokens of `episodes` sampled so far the log-probs of the weights that sampled them, where the
        engine gave none (`hf`): called on carried episodes before the weights change.

        Args:
            episodes: Episodes to be carried on (`EpisodeCarry.episodes`).
            logps_of: (B, P + R) log-probs of a batch's tokens under the current weights (the explorer's policy).
        """
        pending = [e for e in episodes if e.known_logps < len(e.ids)]
        if not pending:
            return
        batch, _ = self.to_batch(pending)
        logps = logps_of(batch).float().cpu()
        start = batch["input_ids"].shape[1] - max(len(e.ids) for e in pending)  # where the prompts end
        for row, episode in enumerate(pending):
            values = logps[row, start:start + len(episode.ids)].tolist()
            episode.logps = [value if acted else 0.0 for value, acted in zip(values, episode.action)]
            episode.known_logps = len(episode.ids)

    def sample_turns(self, active: list[Episode], *, stops: list[int]) -> None:
        """One model turn for every active episode, in one generate call."""
        options, pad = self.generation, self.tokenizer.pad_token_id
        budgets = [self.turn_budget(e) for e in active]
        carried = carries_kv(self.engine)
        if carried:  # the plain hf engine: each episode runs only what its cache lacks
            turns = sample_next_turns(self.engine, [e.cache for e in active], [e.unfed_ids() for e in active],
                                      options, stop_token_ids=stops, pad_token_id=pad, budgets=budgets)
            for episode, cache in zip(active, turns.caches):
                episode.cache = cache
            sampled = turns.sampled
        else:  # vllm (its prefix cache holds the history), or an engine whose generate is replaced
            prompt_ids, prompt_mask = left_pad([e.prompt_ids + e.ids for e in active], pad)
            sampled = self.engine.generate(prompt_ids.to(self.device), prompt_mask.to(self.device),
                                           options.model_copy(update={"max_new_tokens": max(budgets)}),
                                           stop_token_ids=stops, pad_token_id=pad)
        for row, (episode, budget) in enumerate(zip(active, budgets)):
            # The carried turns' log-probs are dropped, as the re-reading hf engine returns none: the loop's own
            # forward gives the behaviour log-probs either way, so both paths train on the same numbers.
            logps = sampled.logps[row].float().tolist() if sampled.logps is not None and not carried else None
            self.accept_turn(episode, sampled.ids[row, :budget].tolist(), logps, stops=stops)

    def turn_budget(self, episode: Episode) -> int:
        """The most tokens the episode's next turn may take: `generation.max_new_tokens`, or what its
        `max_total_tokens` leaves."""
        return min(self.generation.max_new_tokens, self.agent.config.max_total_tokens - len(episode.ids))

    def accept_turn(self, episode: Episode, ids: list[int], logps: list[float] | None, *, stops: list[int]) -> None:
        """Append the model turn sampled as `ids` (within its budget; what follows its first stop token dropped)
        with the engine's log-probs (None where it gives none); a turn without a stop token ends the episode."""
        ends = [i for i, token in enumerate(ids) if token in stops]
        turn = ids[:ends[0] + 1] if ends else ids
        episode.extend(turn, True, logps[:len(turn)] if logps is not None else None)
        episode.num_turns += 1
        episode.last_turn = self.tokenizer.decode(turn, skip_special_tokens=True)
        episode.segments.append((self.tokenizer.decode(turn), True))
        if not ends:  # ran out of tokens before its stop token
            episode.end(truncated=True)

    def to_batch(self, episodes: list[Episode]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The (B, P + R) batch as `single_turn.sample` lays it out: prompts left-padded, the rest right-padded."""
        pad, device = self.tokenizer.pad_token_id, self.device
        prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], pad)
        width = max(len(e.ids) for e in episodes)
        rest = torch.tensor([e.ids + [pad] * (width - len(e.ids)) for e in episodes])  # (B, R)
        rest_mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in episodes])
        action = torch.tensor([e.action + [0] * (width - len(e.ids)) for e in episodes])
        attention_mask = torch.cat([prompt_mask, rest_mask], dim=1)
        batch = {"input_ids": torch.cat([prompt_ids, rest], dim=1).to(device),
                 "attention_mask": attention_mask.to(device),
                 "action_mask": torch.cat([torch.zeros_like(prompt_mask), action], dim=1).to(device),
                 "position_ids": positions_from_mask(attention_mask).to(device),
                 "truncated": torch.tensor([float(e.truncated) for e in episodes], device=device)}
        if not any(e.known_logps for e in episodes):  # hf, nothing carried: the caller computes them
            return batch, None
        logps = torch.tensor([e.logps + [0.0] * (width - len(e.ids)) for e in episodes])
        return batch, torch.cat([torch.zeros_like(prompt_mask, dtype=torch.float32), logps], dim=1).to(device)


def known_logps_mask(episodes: list[Episode], batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """(B, P + R) True where the engine's log-probs are the behaviour log-probs (every token of an engine that gives
    them, `vllm`; a carried episode's tokens before the weights changed, `hf`); None when that is every token."""
    if all(e.known_logps == len(e.ids) for e in episodes):
        return None
    width = batch["input_ids"].shape[1]
    start = width - max(len(e.ids) for e in episodes)
    columns = torch.arange(width, device=batch["input_ids"].device)
    known = torch.tensor([start + e.known_logps for e in episodes], device=columns.device)
    return columns[None, :] < known[:, None]


class EpisodeCarry:
    """Groups an over-sampled rollout left unfinished, carried on to the next rollout under newer weights, for the
    asynchronous explorer (`trainer.asynchronous.explorer`, docs/agents.md).

    Each episode keeps the weight version it started under (`Episode.first_version`); a carried group older than
    `oldest_version` when the next rollout starts is dropped (bounded staleness: the batch it would join would be
    rejected), its steps left unwaited. An episode's KV cache is dropped when it is carried (the next turn re-reads
    its history under the new weights), a turn vLLM was sampling is sampled again, and the log-probs of the tokens
    sampled so far stay those of the weights that sampled them (vLLM's own; with `hf`, the explorer's
    `record_behaviour_logps` before it loads the next weights), so the staleness correction weighs each token by the
    weights that really sampled it.

    Args:
        max_concurrent_steps: Environment steps at once, on one pool for every rollout (`StepCarry`).

    Attributes:
        version: The weight version the next collect samples with (set by the caller).
        oldest_version: Carried groups that started before this version are dropped at the next collect.
        episodes: The carried groups' episodes, whole groups in row order.
    """

    def __init__(self, max_concurrent_steps: int) -> None:
        self.steps = StepCarry(max_concurrent_steps)
        self.version = 0
        self.oldest_version = 0
        self.episodes: list[Episode] = []
        self.num_dropped = 0

    def take(self, group_size: int) -> list[Episode]:
        """The carried episodes young enough to go on (whole groups, row order); the rest dropped and counted."""
        groups = [self.episodes[i:i + group_size] for i in range(0, len(self.episodes), group_size)]
        fresh = [e for group in groups if group[0].first_version >= self.oldest_version for e in group]
        stale = [e for group in groups if group[0].first_version < self.oldest_version for e in group]
        self.steps.drop(stale)
        self.num_dropped, self.episodes = len(stale), []
        return fresh

    def keep(self, episodes: list[Episode]) -> None:
        """Carry these (whole groups, row order) on to the next collect."""
        self.episodes = episodes

    def metrics(self, kept: list[Episode]) -> dict[str, float]:
        """`agent/carried_episodes` (rows of the batch that started under older weights), `agent/carried_over`
        (episodes left for the next rollout), `agent/stale_episodes_dropped` (carried ones too old to go on)."""
        return {"agent/carried_episodes": float(sum(e.first_version < self.version for e in kept)),
                "agent/carried_over": float(len(self.episodes)),
                "agent/stale_episodes_dropped": float(self.num_dropped),
                "agent/abandoned_episodes": float(self.num_dropped)}

    def close(self) -> None:
        self.steps.close()
        self.episodes = []


class StreamedTurns:
    """The turns of `episodes` on an engine that batches continuously (`RolloutEngine.turn_stream`), for the
    `as_ready` schedule (`trainer.rollout.turn_scheduler.TurnQueue`).

    A turn's seed is fixed by the episode's row and turn number (and one draw per rollout from torch's generator,
    which the stages seed and checkpoint), not by when the turn was submitted, so it draws the same random numbers
    whichever turns share the engine's steps with it.

    Args:
        rollout: Gives each turn's budget and appends it (`accept_turn`).
        stream: The engine's `TurnStream`.
        episodes: The rollout's episodes, in row order.
        stops: Token ids that end a turn.
    """

    def __init__(self, rollout: MultiTurnRollout, stream: Any, episodes: list[Episode], stops: list[int]) -> None:
        self.rollout, self.stream, self.stops = rollout, stream, stops
        self.rows = {id(episode): row for row, episode in enumerate(episodes)}
        self.in_flight: dict[int, Episode] = {}
        self.base_seed = int(torch.randint(0, 2**31 - 1, ()).item()) if rollout.generation.temperature else None

    def __len__(self) -> int:
        return len(self.in_flight)

    def submit(self, episode: Episode) -> None:
        seed = None
        if self.base_seed is not None:
            seed = hash((self.base_seed, self.rows[id(episode)], episode.num_turns)) % (2**31 - 1)
        self.in_flight[id(episode)] = episode
        self.stream.submit(id(episode), episode.prompt_ids + episode.ids, self.rollout.turn_budget(episode), seed)

    def advance(self) -> list[Episode]:
        turned = []
        for key, ids, logps in self.stream.step():
            episode = self.in_flight.pop(key)
            self.rollout.accept_turn(episode, ids, logps, stops=self.stops)
            turned.append(episode)
        return turned

    def abort(self) -> None:
        self.stream.abort()
        self.in_flight.clear()


class CompleteGroups:
    """Which groups of consecutive rows have every episode ended, for over-sampled rollouts.

    Args:
        num_rows: Rows of the rollout.
        group_size: Consecutive rows per group.
        num_groups: Groups needed; None: all of them.
    """

    def __init__(self, num_rows: int, group_size: int, num_groups: int | None) -> None:
        if group_size < 1 or num_rows % group_size:
            raise ValueError(f"{num_rows} rows are not whole groups of {group_size}")
        self.group_size = group_size
        self.num_groups = num_rows // group_size if num_groups is None else num_groups
        if not 0 < self.num_groups <= num_rows // group_size:
            raise ValueError(f"{num_groups} groups needed of the {num_rows // group_size} given")

    def complete(self, episodes: list[Episode]) -> list[int]:
        """The groups (by index, in row order) whose episodes have all ended."""
        size = self.group_size
        return [group for group in range(len(episodes) // size)
                if all(e.done for e in episodes[group * size:(group + 1) * size])]

    def is_enough(self, episodes: list[Episode]) -> bool:
        return len(self.complete(episodes)) >= self.num_groups

    def kept_rows(self, episodes: list[Episode]) -> list[int]:
        """The rows of the first `num_groups` complete groups in row order (all rows when every episode ran)."""
        size = self.group_size
        return [group * size + i for group in self.complete(episodes)[:self.num_groups] for i in range(size)]


def concurrent_steps(config: EnvironmentConfig, environment_class: type[Environment]) -> int:
    """Environment steps that may run at once: `environment.max_concurrent_episodes`, or fewer where the
    environment class sets its own `max_concurrent_steps`.

    Raises:
        ConfigError: The class's `max_concurrent_steps` is not a positive integer.
    """
    own = environment_class.max_concurrent_steps
    if own is None:
        return config.max_concurrent_episodes
    if isinstance(own, bool) or not isinstance(own, int) or own < 1:
        raise ConfigError(f"environment.name: {config.name!r} sets max_concurrent_steps = {own!r}, expected a "
                          "positive integer or None")
    return min(config.max_concurrent_episodes, own)


def episode_metrics(episodes: list[Episode], timings: dict[str, float]) -> dict[str, float]:
    """The `agent/*` metrics of one rollout (docs/agents.md)."""
    count = max(len(episodes), 1)
    calls = sum(e.num_tool_calls for e in episodes)
    errors = sum(e.num_tool_errors for e in episodes)
    busy = timings["generate"] + timings["environment"]
    return {"agent/turns_per_episode": sum(e.num_turns for e in episodes) / count,
            "agent/tool_calls_per_episode": calls / count,
            "agent/tool_error_rate": errors / calls if calls else 0.0,
            "agent/valid_tool_call_fraction": (calls - errors) / calls if calls else 0.0,
            "agent/truncated_fraction": sum(e.truncated for e in episodes) / count,
            "agent/generate_seconds": timings["generate"], "agent/tool_seconds": timings["tools"],
            "agent/environment_seconds": timings["environment"],
            "agent/tool_time_share": timings["environment"] / busy if busy else 0.0,
            "agent/generated_tokens": float(sum(sum(e.action) for e in episodes))}


def render_trajectory(segments: list[tuple[str, bool]]) -> str:
    """An episode for reports: model text as written, observations inside `⟦...⟧` (never trained on)."""
    return " ".join(text if is_model else f"⟦{text}⟧" for text, is_model in segments)
