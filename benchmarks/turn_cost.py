"""What each turn of an agent episode costs with the `hf` engine: re-reading the whole episode, against carrying
each episode's KV cache from turn to turn (`trainer.rollout.episode_cache`).

    PYTHONPATH=. .venv/bin/python benchmarks/turn_cost.py --episodes 32 --repeats 15

The shape of `benchmarks/agent_rollouts.py`: `--episodes` episodes of the tiny model (random init, 2 heads of 32)
on one thread, chat-template prompts, up to `--max-new-tokens` tokens a turn at temperature 1, a third of the
characters stop tokens (turns end after a few tokens, as a tool call's would, or run to the limit and end the
episode), and after each turn the calculator's answer as a tool message. Both ways sample the same turns (same
seed, same sampling; the script checks it), so they do the same work but for what they re-read. Printed per turn:
the seconds of the sampling call (best of `--repeats`, the two ways alternating), the same divided by the call's
decode steps (its longest turn: turns differ in length, and a turn of twice the steps costs twice as much whatever
the cache), the episodes sampled, the longest episode so far, and the last turn / turn 1 for each way. A second
table repeats it with only EOS stopping turns, so that every turn decodes `--max-new-tokens` steps and only the
history grows. Re-reading prefills the whole episode every turn; carrying prefills only what is new (the last
sampled token and the observation) and copies the caches in and out.
"""

from __future__ import annotations

import argparse
import string
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_episodes(engine, tokenizer, prompts: list[list[int]], options, stops: list[int], num_turns: int,
                 is_carrying: bool, seed: int, ends_truncated: bool) -> list[tuple[float, int, int, list[list[int]]]]:
    """Episodes of `num_turns` turns; per turn (seconds of the sampling call, episodes sampled, longest episode, the
    turns kept). `ends_truncated`: a turn without a stop token ends its episode, as in the rollout."""
    from trainer.data.tool_calls import ObservationEncoder
    from trainer.rollout.episode_cache import kept_lengths, sample_next_turns
    from trainer.rollout.single_turn import left_pad

    observations = ObservationEncoder(tokenizer)
    pad = tokenizer.pad_token_id
    sequences = [list(prompt) for prompt in prompts]
    caches, unfed = [None] * len(prompts), [list(prompt) for prompt in prompts]
    running = list(range(len(prompts)))
    budgets = [options.max_new_tokens] * len(prompts)
    torch.manual_seed(seed)
    costs = []
    for _ in range(num_turns):
        if not running:
            break
        start = time.perf_counter()
        if is_carrying:
            turns = sample_next_turns(engine, [caches[i] for i in running], [unfed[i] for i in running], options,
                                      stop_token_ids=stops, pad_token_id=pad)
            sampled = turns.sampled.ids
            for episode, cache in zip(running, turns.caches):
                caches[episode] = cache
        else:
            ids, mask = left_pad([sequences[i] for i in running], pad)
            sampled = engine.generate(ids, mask, options, stop_token_ids=stops, pad_token_id=pad).ids
        seconds = time.perf_counter() - start
        lengths = kept_lengths(sampled, stops, budgets[:len(running)]).tolist()
        kept = [row[:length].tolist() for row, length in zip(sampled, lengths)]
        costs.append((seconds, len(running), max(len(sequences[i]) for i in running), kept))
        still_running = []
        for episode, turn in zip(running, kept):
            if ends_truncated and turn[-1] not in stops:  # ran out of tokens: the rollout ends such an episode
                continue
            observation = observations.ids([{"role": "tool", "content": "1776"}], tokenizer.decode(turn[-1:]))
            sequences[episode] += turn + observation
            unfed[episode] = turn[-1:] + observation
            still_running.append(episode)
        running = still_running
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from trainer.config import GenerationConfig
    from trainer.modeling.models import load_tokenizer
    from trainer.rollout.engines import HFGenerateEngine
    from trainer.tiny.model import write_tiny_model

    directory = write_tiny_model(Path(tempfile.mkdtemp()) / "model", num_heads=2)
    tokenizer = load_tokenizer(str(directory))
    engine = HFGenerateEngine(AutoModelForCausalLM.from_pretrained(directory), num_threads=1)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"{n}*7="}], add_generation_prompt=True,
                                           tokenize=False) for n in range(args.episodes)]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    scenarios = {  # name: (extra stop strings, whether a turn without a stop token ends its episode)
        "agent (a third of the characters stop a turn, as in agent_rollouts.py)":
            (list(string.ascii_letters[:32]), True),
        f"fixed (only EOS stops: every turn decodes {args.max_new_tokens} steps, every episode goes on)": ([], False),
    }
    for title, (stop, ends_truncated) in scenarios.items():
        options = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, stop=stop)
        print(f"\n{title}; {args.episodes} episodes, up to {args.max_new_tokens} new tokens a turn, best of "
              f"{args.repeats}")
        print_table(measure(engine, tokenizer, prompts, options, args, ends_truncated))


def measure(engine, tokenizer, prompts, options, args, ends_truncated: bool) -> dict[str, tuple[list[float], list]]:
    """Per way (re-read, carried): the best seconds of each turn over `--repeats` runs, and one run's costs."""
    from trainer.rollout.single_turn import stop_token_ids

    stops = stop_token_ids(tokenizer, options)
    ways = {"re-read": False, "carried": True}
    for is_carrying in ways.values():  # warm-up: first calls build what later calls reuse
        run_episodes(engine, tokenizer, prompts, options, stops, 1, is_carrying, args.seed, ends_truncated)
    results: dict[str, tuple[list[float], list]] = {}
    for _ in range(args.repeats):
        for name, is_carrying in ways.items():
            costs = run_episodes(engine, tokenizer, prompts, options, stops, args.turns, is_carrying, args.seed,
                                 ends_truncated)
            seconds = [cost[0] for cost in costs]
            if name in results:
                seconds = [min(pair) for pair in zip(results[name][0], seconds)]
            results[name] = (seconds, costs)
    return results


def print_table(results: dict[str, tuple[list[float], list]]) -> None:
    reread, carried = results["re-read"][1], results["carried"][1]
    same = [cost[3] for cost in reread] == [cost[3] for cost in carried]
    turns = len(reread)
    print(f"both ways sampled the same turns: {'yes' if same else 'NO'}")
    print("| way | " + " | ".join(f"turn {n + 1} s" for n in range(turns)) + f" | turn {turns} / turn 1 |")
    print("|---|" + "---|" * (turns + 1))
    steps = [max(map(len, cost[3])) for cost in reread]  # what the call decodes: its longest turn
    for name, (seconds, _) in results.items():
        print(f"| {name} | " + " | ".join(f"{s:.4f}" for s in seconds) + f" | {seconds[-1] / seconds[0]:.2f}x |")
    for name, (seconds, _) in results.items():  # turns differ in length: the cost of each step, prefill included
        per_step = [s / n for s, n in zip(seconds, steps)]
        print(f"| {name}, per decode step | " + " | ".join(f"{s * 1e3:.2f} ms" for s in per_step)
              + f" | {per_step[-1] / per_step[0]:.2f}x |")
    print("| episodes sampled | " + " | ".join(str(cost[1]) for cost in reread) + " | |")
    print("| longest episode before the turn (tokens) | " + " | ".join(str(cost[2]) for cost in reread) + " | |")
    print("| longest turn (decode steps) | " + " | ".join(map(str, steps)) + " | |")

if __name__ == "__main__":
    main()
