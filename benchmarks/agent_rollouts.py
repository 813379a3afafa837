"""Multi-turn rollout speed with either engine: what each turn costs, and what the schedule of turns gains.

    PYTHONPATH=. .venv/bin/python benchmarks/agent_rollouts.py --episodes 32 --repeats 2
    PYTHONPATH=. .venv/bin/python benchmarks/agent_rollouts.py --table schedules --episodes 64 --repeats 3
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/agent_rollouts.py --engine vllm   # the environment of make test-vllm

Both tables sample batches of `--episodes` episodes of the tiny model (random init, `trainer.tiny.model`)
with 2 heads of 32 (the `tiny-vllm` preset's, which vLLM's CPU attention can run), on one thread. A
random model rarely samples EOS, so a third of the characters are stop tokens: turns end after a few
tokens, as a tool call's would, or run to `--max-new-tokens` (the episode is then cut).

`--table turns` (the default): an environment that calls the calculator once per turn and ends after
1, 2 or 4 turns. Per turn count: episodes/s, generated tokens/s, the share of wall time inside tools,
and the seconds of each generate call by turn: with `hf` turn k re-reads the whole episode so far (HF
`generate` keeps no cache between calls); with `vllm` the episode so far is a prefix of turn k's
prompt, which vLLM's prefix cache holds from turn k-1.

`--table schedules`: an environment whose tool sleeps a log-normal time (50 ms median, 2 s at the
99th percentile) and whose episodes last 1 to 8 turns, both drawn per row from `--seed`, so every
schedule runs the same turns against the same latencies. The schedules `lockstep` and `as_ready`
(`environment.schedule`) alternate on the same rows; per schedule: episodes/s, the engine's idle
fraction (the share of wall time with no generate call running), generate calls, and as_ready's
episodes/s over lockstep's. With `vllm`, as_ready batches continuously (each turn a request, joining the
engine's running batch at its next step; its "calls" are engine steps); a third row runs as_ready on whole-batch
generate calls, as `hf` must, to show what continuous batching adds.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import string
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.agents.environment import Environment, Observation  # noqa: E402

MEDIAN_TOOL_SECONDS = 0.05
P99_TOOL_SECONDS = 2.0
# A log-normal's 99th percentile is its median times exp(2.326 sigma).
TOOL_SIGMA = math.log(P99_TOOL_SECONDS / MEDIAN_TOOL_SECONDS) / 2.3263


class FixedTurnsEnvironment(Environment):
    """Calls the calculator once per turn; ends after the row's `turns` turns."""

    default_tools = ("calculator",)

    def step(self, turn: str) -> Observation:
        self.count = getattr(self, "count", 0) + 1
        result = self.tools.call("calculator", {"expression": "37*48"})
        return Observation(messages=[{"role": "tool", "content": result.content}],
                           done=self.count >= int(self.row["turns"]), tool_seconds=result.seconds, num_tool_calls=1)


def tool_latency(seed: int, row: int, turn: int) -> float:
    """Seconds of row `row`'s tool call at turn `turn`: log-normal, drawn from (seed, row, turn) alone."""
    return random.Random(f"{seed}:{row}:{turn}").lognormvariate(math.log(MEDIAN_TOOL_SECONDS), TOOL_SIGMA)


def heavy_tailed_lookup(seed: int, row: int, turn: int) -> str:
    """Sleep `tool_latency(seed, row, turn)`: the same latency under every schedule."""
    time.sleep(tool_latency(seed, row, turn))
    return "ok"


def tool_bounds(rows: list[dict]) -> tuple[float, float]:
    """The tool time no schedule can beat: lockstep's (each turn waits for its slowest call) and as_ready's (the
    episode whose calls take longest in all), ignoring generation."""
    latencies = [[tool_latency(r["seed"], r["index"], turn) for turn in range(1, r["turns"] + 1)] for r in rows]
    lockstep = sum(max((calls[turn] for calls in latencies if len(calls) > turn), default=0.0) for turn in range(8))
    return lockstep, max(sum(calls) for calls in latencies)


class HeavyTailedEnvironment(Environment):
    """Calls `heavy_tailed_lookup` once per turn; ends after the row's `turns` turns."""

    default_tools = ("heavy_tailed_lookup",)

    def step(self, turn: str) -> Observation:
        self.count = getattr(self, "count", 0) + 1
        arguments = {"seed": self.row["seed"], "row": self.row["index"], "turn": self.count}
        result = self.tools.call("heavy_tailed_lookup", arguments)
        return Observation(messages=[{"role": "tool", "content": result.content}],
                           done=self.count >= int(self.row["turns"]), tool_seconds=result.seconds, num_tool_calls=1)


def build_engine(engine_name: str):
    """The tiny model's tokenizer and `engine_name` engine, its generate calls recorded as (context, seconds)."""
    from transformers import AutoModelForCausalLM

    from trainer.config.stages import RolloutConfig
    from trainer.modeling.models import load_tokenizer
    from trainer.rollout.engine_registry import build_rollout_engine
    from trainer.rollout.engines import EngineSetup
    from trainer.tiny.model import write_tiny_model

    directory = write_tiny_model(Path(tempfile.mkdtemp()) / "model", num_heads=2)
    tokenizer = load_tokenizer(str(directory))
    policy = AutoModelForCausalLM.from_pretrained(directory) if engine_name == "hf" else None
    engine = build_rollout_engine(RolloutConfig(engine=engine_name, num_threads=1), policy,
                                  EngineSetup(model_path=str(directory)))
    generate = engine.generate

    def timed_generate(prompt_ids, prompt_mask, options, **kwargs):
        start = time.perf_counter()
        out = generate(prompt_ids, prompt_mask, options, **kwargs)
        engine.calls.append((prompt_ids.shape[1], time.perf_counter() - start))
        return out

    engine.generate = timed_generate
    open_stream = engine.turn_stream

    @contextlib.contextmanager
    def timed_stream(*args, **kwargs):  # `as_ready` with vllm: each engine step is a call (of every turn in flight)
        with open_stream(*args, **kwargs) as stream:
            step = stream.step

            def timed_step():
                start = time.perf_counter()
                out = step()
                engine.calls.append((-1, time.perf_counter() - start))
                return out

            stream.step = timed_step
            yield stream

    engine.streams_turns = open_stream(generation_options(), stop_token_ids=[], num_rows=1) is not None
    if engine.streams_turns:
        engine.turn_stream = timed_stream
    engine.calls = []
    engine.name = engine_name
    return tokenizer, engine


def run_once(agent, engine, tokenizer, rows, generation, scorer, seed: int):
    """(wall seconds, the rollout's metrics, the engine's calls) of one batch of episodes."""
    from trainer.config.stages import RolloutConfig
    from trainer.rollout.multi_turn import MultiTurnRollout

    rollout = MultiTurnRollout(engine, agent=agent, tokenizer=tokenizer, generation=generation,
                               device=torch.device("cpu"), scorer=scorer, settings=RolloutConfig(engine=engine.name))
    torch.manual_seed(seed)
    engine.calls = []
    start = time.perf_counter()
    scored = rollout.collect(rows)
    return time.perf_counter() - start, scored.metrics, list(engine.calls)


def print_turn_costs(args, tokenizer, engine, generation, scorer) -> None:
    from trainer.config.environment import EnvironmentConfig
    from trainer.rollout.multi_turn import Agent

    print("| turns | episodes/s | generated tokens/s | tokens/episode | context at last turn | time in tools | "
          "seconds per generate call, turn 1..n |")
    print("|---|---|---|---|---|---|---|")
    for turns in (int(t) for t in args.turns.split(",")):
        agent = Agent(EnvironmentConfig(name="fixed_turns", max_turns=turns, max_total_tokens=1024), tokenizer)
        rows = [{"prompt": [{"role": "user", "content": f"{n}*7="}], "answer": "0", "turns": turns}
                for n in range(args.episodes)]
        runs = [run_once(agent, engine, tokenizer, rows, generation, scorer, repeat) for repeat in range(args.repeats)]
        seconds, metrics, calls = min(runs, key=lambda r: r[0])
        tokens = metrics["agent/generated_tokens"]
        print(f"| {turns} | {args.episodes / seconds:.1f} | {tokens / seconds:.0f} | {tokens / args.episodes:.1f} | "
              f"{calls[-1][0]} | {metrics['agent/tool_seconds'] / seconds:.1%} | "
              f"{', '.join(f'{s:.2f}' for _, s in calls)} |")


def print_schedules(args, tokenizer, engine, generation, scorer) -> None:
    from trainer.config.environment import EnvironmentConfig
    from trainer.rollout.multi_turn import Agent

    draw = random.Random(args.seed)
    rows = [{"prompt": [{"role": "user", "content": f"{n}*7="}], "answer": "0", "turns": draw.randint(1, 8),
             "seed": args.seed, "index": n} for n in range(args.episodes)]
    concurrency = args.max_concurrent_episodes or args.episodes
    best = {}
    streams = engine.turn_stream
    # An engine that batches continuously (vllm) also runs as_ready the way hf must: a whole batch per call.
    variants = [("lockstep", streams), ("as_ready", streams)]
    if getattr(engine, "streams_turns", False):
        variants.append(("as_ready, whole batches", lambda *args, **kwargs: None))
    for repeat in range(args.repeats):
        for name, turn_stream in variants:
            engine.turn_stream = turn_stream
            config = EnvironmentConfig(name="heavy_tailed", schedule=name.split(",")[0], max_turns=8,
                                       max_total_tokens=1024, tool_timeout_seconds=60,
                                       max_concurrent_episodes=concurrency)
            run = run_once(Agent(config, tokenizer), engine, tokenizer, rows, generation, scorer, repeat)
            best[name] = min(best.get(name, run), run, key=lambda r: r[0])
    engine.turn_stream = streams
    print(f"{args.episodes} episodes, {sum(r['turns'] for r in rows)} turns, {concurrency} environment steps at once, "
          f"best of {args.repeats}; load average before: {args.load}, after: {read_load()}")
    print("tool time alone, lockstep: {:.2f} s, as_ready: {:.2f} s".format(*tool_bounds(rows)))
    print("(vllm's as_ready batches continuously: its calls are engine steps, each one token of every turn in flight)")
    print("| schedule | episodes/s | engine idle | generate calls | turns per call | turns/episode | "
          "seconds in tools (summed) | wall seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for schedule, (seconds, metrics, calls) in best.items():
        idle = 1 - metrics["agent/generate_seconds"] / seconds
        print(f"| {schedule} | {args.episodes / seconds:.2f} | {idle:.0%} | {len(calls)} | "
              f"{metrics['agent/turns_per_episode'] * args.episodes / len(calls):.1f} | "
              f"{metrics['agent/turns_per_episode']:.2f} | {metrics['agent/tool_seconds']:.1f} | {seconds:.2f} |")
    print(f"as_ready / lockstep, episodes/s: {best['lockstep'][0] / best['as_ready'][0]:.2f}x")


def generation_options(max_new_tokens: int = 24):
    """Sampling at temperature 1; a third of the characters stop a turn (the module docstring)."""
    from trainer.config import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, temperature=1.0, stop=list(string.ascii_letters[:32]))


def read_load() -> str:
    """The 1-, 5- and 15-minute load averages (/proc/loadavg)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", choices=["turns", "schedules"], default="turns")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", default="1,2,4", help="--table turns: the turn counts")
    parser.add_argument("--seed", type=int, default=0, help="--table schedules: draws turns and tool latencies")
    parser.add_argument("--max-concurrent-episodes", type=int, default=0,
                        help="--table schedules: environment steps at once; 0: one per episode")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    args.load = read_load()
    os.environ["ALIGNFLOW_ENVIRONMENTS"] = ("fixed_turns=__main__:FixedTurnsEnvironment,"
                                            "heavy_tailed=__main__:HeavyTailedEnvironment")
    os.environ["ALIGNFLOW_TOOLS"] = "heavy_tailed_lookup=__main__:heavy_tailed_lookup"
    from trainer.rewards.functions import FunctionScorer, load_reward_function

    tokenizer, engine = build_engine(args.engine)
    scorer = FunctionScorer(load_reward_function("tiny_calculator"))
    generation = generation_options(args.max_new_tokens)
    table = print_schedules if args.table == "schedules" else print_turn_costs
    table(args, tokenizer, engine, generation, scorer)


if __name__ == "__main__":
    main()
