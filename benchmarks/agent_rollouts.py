"""Multi-turn rollout speed with either engine: episodes/s, generated tokens/s, and what each turn costs.

    PYTHONPATH=. .venv/bin/python benchmarks/agent_rollouts.py --episodes 32 --repeats 2
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/agent_rollouts.py --engine vllm   # the environment of make test-vllm

One batch of `--episodes` episodes of the tiny model (random init, `trainer.tiny.model`) in an
environment that calls the calculator tool once per turn and ends after 1, 2 or 4 turns. A random
model rarely samples EOS, so a third of the characters are stop tokens: turns end after a few
tokens, as a tool call's would, or run to `--max-new-tokens` (the episode is then cut). The script
prints, per turn count, episodes/s, generated tokens/s, the share of wall time inside tools, and the
seconds of each generate call by turn: with `hf` turn k re-reads the whole episode so far (HF
`generate` keeps no cache between calls); with `vllm` the episode so far is a prefix of turn k's
prompt, which vLLM's prefix cache holds from turn k-1. Both engines sample the same model, whose
2 heads of 32 vLLM's CPU attention can run (the `tiny-vllm` preset's), on one thread.
"""

from __future__ import annotations

import argparse
import os
import string
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.agents.environment import Environment, Observation  # noqa: E402


class FixedTurnsEnvironment(Environment):
    """Calls the calculator once per turn; ends after the row's `turns` turns."""

    default_tools = ("calculator",)

    def step(self, turn: str) -> Observation:
        self.count = getattr(self, "count", 0) + 1
        result = self.tools.call("calculator", {"expression": "37*48"})
        return Observation(messages=[{"role": "tool", "content": result.content}],
                           done=self.count >= int(self.row["turns"]), tool_seconds=result.seconds, num_tool_calls=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", default="1,2,4")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    os.environ["ALIGNFLOW_ENVIRONMENTS"] = "fixed_turns=__main__:FixedTurnsEnvironment"
    from transformers import AutoModelForCausalLM

    from trainer.agents.rollout import AgentRollout
    from trainer.config import GenerationConfig
    from trainer.config.environment import EnvironmentConfig
    from trainer.config.stages import RolloutConfig
    from trainer.modeling.models import load_tokenizer
    from trainer.online.engine_registry import build_rollout_engine
    from trainer.online.engines import EngineSetup
    from trainer.online.reward_sources import FunctionScorer, load_reward_function
    from trainer.tiny.model import write_tiny_model

    directory = write_tiny_model(Path(tempfile.mkdtemp()) / "model", num_heads=2)
    tokenizer = load_tokenizer(str(directory))
    policy = AutoModelForCausalLM.from_pretrained(directory) if args.engine == "hf" else None
    engine = build_rollout_engine(RolloutConfig(engine=args.engine, num_threads=1), policy,
                                  EngineSetup(model_path=str(directory)))
    generate = engine.generate

    def timed_generate(prompt_ids, prompt_mask, options, **kwargs):  # records (context length, seconds) per call
        start = time.perf_counter()
        out = generate(prompt_ids, prompt_mask, options, **kwargs)
        engine.calls.append((prompt_ids.shape[1], time.perf_counter() - start))
        return out

    engine.generate = timed_generate
    scorer = FunctionScorer(load_reward_function("tiny_calculator"))
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=1.0,
                                  stop=list(string.ascii_letters[:32]))
    print("| turns | episodes/s | generated tokens/s | tokens/episode | context at last turn | time in tools | "
          "seconds per generate call, turn 1..n |")
    print("|---|---|---|---|---|---|---|")
    for turns in (int(t) for t in args.turns.split(",")):
        agent = AgentRollout(EnvironmentConfig(name="fixed_turns", max_turns=turns, max_total_tokens=1024), tokenizer)
        rows = [{"prompt": [{"role": "user", "content": f"{n}*7="}], "answer": "0", "turns": turns}
                for n in range(args.episodes)]
        best = None
        for repeat in range(args.repeats):
            torch.manual_seed(repeat)
            engine.calls = []
            start = time.perf_counter()
            rollout = agent.generate_and_score(engine, tokenizer, rows, generation, torch.device("cpu"), scorer)
            seconds = time.perf_counter() - start
            if best is None or seconds < best[0]:
                best = (seconds, rollout.metrics, list(engine.calls))
        seconds, metrics, calls = best
        tokens = metrics["agent/generated_tokens"]
        print(f"| {turns} | {args.episodes / seconds:.1f} | {tokens / seconds:.0f} | {tokens / args.episodes:.1f} | "
              f"{calls[-1][0]} | {metrics['agent/tool_seconds'] / seconds:.1%} | "
              f"{', '.join(f'{s:.2f}' for _, s in calls)} |")


if __name__ == "__main__":
    main()
