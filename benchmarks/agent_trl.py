"""Multi-turn GRPO with a calculator tool: alignflow and TRL 1.16 side by side on the tiny tool-use task.

    .venv/bin/python benchmarks/agent_trl.py              # both variants, 3 repeats: 6-7 minutes on 2 busy cores
    .venv/bin/python benchmarks/agent_trl.py --variants calculator --repeats 2 --steps 8
    .venv/bin/python benchmarks/agent_trl.py --keep /tmp/agent-trl --json out.json   # keeps the SFT model for reruns

The task is `trainer.tiny.agent_task` (`37*48=`, a `calculator` tool, reward 1 when the last turn is the product),
the model the tiny preset's (`trainer.tiny.model`: a 2-layer Llama, one token per character). A random model never
writes a parseable call, so the script first runs the `rlhf-agent` preset's SFT stage on the task's traces (alignflow,
15 epochs, 40-60 s; `--keep` reuses it): that model calls the calculator in every episode, with the teacher's `36x48`
habit on some. Every measured run then trains that model for `--steps` GRPO steps in its own interpreter, with the
preset's GRPO settings (`pipelines.presets.TINY_AGENT_RUN`): 8 prompts x 8 episodes a step, one optimizer step a
rollout, up to 3 model turns, 80 new tokens a turn, 200 tokens after the prompt in all, temperature 0.5, lr 1e-4:

- `alignflow-lockstep`, `alignflow-as_ready`: the GRPO stage with `environment.name: tiny_calculator` under each
  `environment.schedule`, everything else at alignflow's defaults (the `hf` engine, each episode's KV cache carried
  between turns, 8 environment steps at once) but `grpo.beta: 0` (TRL's default: no reference model);
- `trl`: `trl.GRPOTrainer(tools=[calculator])` at TRL's defaults but those the preset sets, with
  `max_tool_calling_iterations` = max turns - 1 and `max_completion_length` = the 200-token episode budget (TRL has
  no limit per turn), `bf16=False` and `gradient_checkpointing=False` as in `side_by_side.py`.

TRL needs two things the tiny tokenizer lacks: a chat template that renders `tool_calls` and `tool` messages
(`TOOL_CHAT_TEMPLATE`: the tiny template, with each call written as alignflow writes it, so every rendered episode
is the same text), and a response template that parses the model's turns (`RESPONSE_TEMPLATE`;
`trl.chat_template_utils.add_response_schema` knows only the big families' templates). Its tools need a Google-style
docstring describing every argument, so TRL gets a wrapper of the same `calculator`.

Variants (`--variants`): `calculator`, the task's tool as it is (microseconds a call); `heavy`, the same calculator
after a sleep drawn log-normal (50 ms median, 2 s at the 99th percentile, as in `agent_rollouts.py --table schedules`;
the n-th call of an expression sleeps the same time on every side), for `--heavy-steps` steps.

Counted as in `side_by_side.py`: a step is timed from its start to the end of its optimizer step (rollout with the
tools, scoring, update); episodes/s is the run's episodes over its summed step time. Per side, the tool calls per
episode it made (alignflow's `agent/tool_calls_per_episode`, TRL's `tools/call_frequency`), the share that failed,
the model's tokens per episode, the seconds spent inside tools per step (summed over concurrent calls), and the
median step's rollout (sampling with the tools, scoring; TRL's `_generate_and_score_completions`, timed from outside;
the rest of a step is the update). Runs are
interleaved (per repeat and variant, the sides in turn, the order reversed every other repeat), 2 intra-op threads,
`OMP_WAIT_POLICY=PASSIVE`, alignflow's tracking off; x is the median of each repeat's own alignflow/TRL ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.side_by_side import (  # noqa: E402
    NUM_THREADS,
    _quiet_libraries,
    medians,
    paired_ratio,
    require_trl,
)
from pipelines.presets import TINY_AGENT_RUN  # noqa: E402
from trainer.tiny.agent_task import calculator, check_answer  # noqa: E402

SYSTEMS = ("alignflow-lockstep", "alignflow-as_ready", "trl")
ROLLOUT_PHASES = ("generate", "environment", "score")  # alignflow's `perf/time/*` of a rollout: the rest is the update
VARIANTS = ("calculator", "heavy")
TARGET = 1.5  # issue 47: at least 1.5x TRL's GRPO with tools
SEED = 42  # the preset's train.seed
GRPO = TINY_AGENT_RUN["grpo_settings"]
EPISODES_PER_STEP = GRPO["grpo.rollout_batch_size"] * TINY_AGENT_RUN["grpo_generations"]
# The heavy-tailed tool's latency: agent_rollouts.py's (a log-normal's p99 is its median times exp(2.326 sigma)).
MEDIAN_TOOL_SECONDS = 0.05
P99_TOOL_SECONDS = 2.0
TOOL_SIGMA = math.log(P99_TOOL_SECONDS / MEDIAN_TOOL_SECONDS) / 2.3263

# The tiny chat template (trainer.tiny.model.CHAT_TEMPLATE) with `tool_calls` rendered the way alignflow writes them
# into the content for a template without tool support (trainer.data.tool_calls.render_tool_call: compact JSON).
TOOL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "<tool_call>{{ {'name': function['name'], 'arguments': function['arguments']} | tojson(separators=(',', ':')) }}"
    "</tool_call>{% endfor %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
# What transformers' `parse_response` needs to find the calls in a turn (trl's qwen3 template, for the tiny tokens).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"}, "start_anchor": "<|assistant|>",
    "fields": {"tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                              "content": "json", "transform": {"type": "function", "function": "{content}"}},
               "content": {"close_pattern": r"<\|end\|>\s*", "content": "text"}}}


# -- the tools ------------------------------------------------------------------------------------

_calls_so_far: dict[str, int] = {}
_calls_lock = threading.Lock()


def tool_latency(expression: str) -> float:
    """Seconds the n-th call of `expression` sleeps: log-normal, drawn from (expression, n) alone, so every side
    waits the same times for the same calls."""
    with _calls_lock:
        count = _calls_so_far[expression] = _calls_so_far.get(expression, 0) + 1
    return random.Random(f"{expression}:{count}").lognormvariate(math.log(MEDIAN_TOOL_SECONDS), TOOL_SIGMA)


def slow_calculator(expression: str) -> str:
    """The calculator after a heavy-tailed sleep (`heavy`; alignflow's runs register it as `calculator`)."""
    time.sleep(tool_latency(expression))
    return calculator(expression)


class TrlTool:
    """The calculator in the form TRL takes (a docstring describing each argument), timing its calls."""

    def __init__(self, slow: bool) -> None:
        self.seconds = 0.0
        self.function = slow_calculator if slow else calculator

    def tool(self):
        def calculator(expression: str) -> str:
            """Evaluate an integer arithmetic expression (+, -, *, //, %, parentheses).

            Args:
                expression: The expression, for example 37*48.
            """
            started = time.perf_counter()
            try:
                return self.function(expression)
            finally:
                self.seconds += time.perf_counter() - started

        return calculator


# -- the workload ---------------------------------------------------------------------------------


def write_workload(directory: Path) -> dict[str, Path]:
    """The tiny model and the tool-use task's files (the SFT model is trained by the first child)."""
    from trainer.tiny.agent_task import write_agent_task
    from trainer.tiny.model import write_tiny_model

    base = directory / "base"
    if not (base / "config.json").is_file():
        write_tiny_model(base)
    files = write_agent_task(directory / "data")
    return {"base": base, "sft_model": directory / "sft" / "model", **files}


def set_dotted(config: dict, key: str, value) -> None:
    *sections, leaf = key.split(".")
    for section in sections:
        config = config.setdefault(section, {})
    config[leaf] = value


def sft_config(files: dict[str, Path]) -> dict:
    """The rlhf-agent preset's SFT stage on the task's traces."""
    config = {"output_dir": str(files["sft_model"].parent), "model": {"path": str(files["base"])},
              "data": {"train_path": str(files["sft_train"])}, "optimizer": {"lr": TINY_AGENT_RUN["sft_lr"]},
              "train": {"max_epochs": TINY_AGENT_RUN["sft_epochs"], "seed": SEED, "num_threads": NUM_THREADS},
              "checkpoint": {"save_interval": 0, "keep_last": 1}, "tracking": {"backend": "none"}}
    for key, value in TINY_AGENT_RUN["sft_settings"].items():
        set_dotted(config, key, value)
    return config


def alignflow_config(files: dict[str, Path], output_dir: Path, schedule: str, steps: int) -> dict:
    """The rlhf-agent preset's GRPO stage, `steps` rollouts, under `schedule`."""
    config = {"output_dir": str(output_dir), "model": {"path": str(files["sft_model"])},
              "data": {"train_path": str(files["prompts"])}, "optimizer": {"lr": TINY_AGENT_RUN["grpo_lr"]},
              "train": {"seed": SEED, "log_interval": 1, "num_threads": NUM_THREADS},
              "reward": {"function": TINY_AGENT_RUN["reward_function"]},
              "environment": {"name": TINY_AGENT_RUN["environment"], "schedule": schedule},
              "grpo": {"num_episodes": steps, "num_generations": TINY_AGENT_RUN["grpo_generations"], "beta": 0.0},
              "checkpoint": {"save_interval": 0, "keep_last": 1}, "tracking": {"backend": "none"}}
    for key, value in GRPO.items():
        set_dotted(config, key, value)
    return config


# -- child: one run -------------------------------------------------------------------------------


def run_sft(files: dict[str, Path]) -> dict:
    from trainer.config import build_config
    from trainer.supervised.stages import run_stage

    started = time.perf_counter()
    run_stage(build_config("sft", sft_config(files)))
    return {"seconds": time.perf_counter() - started}


def run_alignflow(files: dict[str, Path], output_dir: Path, schedule: str, variant: str, steps: int) -> dict:
    """The GRPO stage through alignflow's own entry point; figures read back from metrics.jsonl."""
    if variant == "heavy":  # the platform's allow-list, as a user registers a tool: the slow one under the task's name
        os.environ["ALIGNFLOW_TOOLS"] = "calculator=__main__:slow_calculator"
    from trainer.config import build_config
    from trainer.online.stages import run_online_stage

    run_online_stage(build_config("grpo", alignflow_config(files, output_dir, schedule, steps)))
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [row for row in rows if "perf/time/step" in row]
    rollouts = [row for row in rows if "agent/tool_calls_per_episode" in row]
    calls = [row["agent/tool_calls_per_episode"] for row in rollouts]
    return {"step_seconds": [row["perf/time/step"] for row in steps_],
            "episodes": EPISODES_PER_STEP * len(steps_),
            "tool_calls_per_episode": statistics.fmean(calls),
            "tool_error_rate": statistics.fmean(row["agent/tool_error_rate"] for row in rollouts),
            "model_tokens_per_episode": statistics.fmean(row["agent/generated_tokens"] for row in rollouts)
            / EPISODES_PER_STEP,
            "reward": statistics.fmean(row[f"rewards/{TINY_AGENT_RUN['reward_function']}/mean"] for row in rollouts),
            "tool_seconds_per_step": statistics.fmean(row["agent/tool_seconds"] for row in rollouts),
            "rollout_seconds_per_step": statistics.median(sum(row[f"perf/time/{phase}"] for phase in ROLLOUT_PHASES)
                                                          for row in steps_)}


def trl_tokenizer(model_dir: Path):
    """The tiny tokenizer with what TRL's tool loop needs: a chat template with tool calls, a response template."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from trainer.data.tool_calls import template_messages

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probe = [{"role": "user", "content": "37*48="},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "37*48"}}}]},
             {"role": "tool", "content": "1776"}, {"role": "assistant", "content": "1776"}]
    alignflows = tokenizer.apply_chat_template(template_messages(tokenizer, probe), tokenize=False)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    if tokenizer.apply_chat_template(probe, tokenize=False) != alignflows:
        raise SystemExit("benchmark: TOOL_CHAT_TEMPLATE renders an episode other than alignflow does")
    if not (supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)):
        raise SystemExit("benchmark: TRL refuses TOOL_CHAT_TEMPLATE")
    return tokenizer


def run_trl(files: dict[str, Path], output_dir: Path, variant: str, steps: int) -> dict:
    """TRL's GRPOTrainer with the calculator as a tool; figures from its log and a step timer."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, TrainerCallback

    datasets.disable_progress_bars()
    tool = TrlTool(slow=variant == "heavy")
    step_seconds: list[float] = []
    tool_seconds: list[float] = []
    rollout_seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started, self.tool_started = time.perf_counter(), tool.seconds

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)
            tool_seconds.append(tool.seconds - self.tool_started)

    def reward(prompts, completions, answer, **_):  # the last assistant turn is exactly the product
        finals = [next((m["content"] for m in reversed(c) if m["role"] == "assistant"), "") for c in completions]
        return [check_answer(final, expected) for final, expected in zip(finals, answer)]

    args = trl.GRPOConfig(
        output_dir=str(output_dir), per_device_train_batch_size=EPISODES_PER_STEP,
        num_generations=TINY_AGENT_RUN["grpo_generations"], max_completion_length=GRPO["environment.max_total_tokens"],
        max_tool_calling_iterations=GRPO["environment.max_turns"] - 1, temperature=GRPO["generation.temperature"],
        learning_rate=TINY_AGENT_RUN["grpo_lr"], lr_scheduler_type=GRPO["optimizer.scheduler"], max_steps=steps,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, gradient_checkpointing=False, use_cpu=True,
        seed=SEED, disable_tqdm=True)
    dataset = datasets.load_dataset("json", data_files=str(files["prompts"]), split="train")
    trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(files["sft_model"]), reward_funcs=[reward],
                              args=args, train_dataset=dataset, processing_class=trl_tokenizer(files["sft_model"]),
                              tools=[tool.tool()], callbacks=[StepTimer()])
    rollout = trainer._generate_and_score_completions  # sampling with the tools, rewards, advantages: timed

    def timed_rollout(*args, **kwargs):
        started = time.perf_counter()
        try:
            return rollout(*args, **kwargs)
        finally:
            rollout_seconds.append(time.perf_counter() - started)

    trainer._generate_and_score_completions = timed_rollout
    trainer.train()
    logged = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    return {"step_seconds": step_seconds, "episodes": EPISODES_PER_STEP * len(step_seconds),
            "tool_calls_per_episode": statistics.fmean(row["tools/call_frequency"] for row in logged),
            "tool_error_rate": statistics.fmean(row["tools/failure_frequency"] for row in logged),
            "model_tokens_per_episode": statistics.fmean(row["completions/mean_length"] for row in logged),
            "reward": statistics.fmean(row["reward"] for row in logged),
            "tool_seconds_per_step": statistics.fmean(tool_seconds),
            "rollout_seconds_per_step": statistics.median(rollout_seconds)}


def run_one(spec_path: Path) -> None:
    """Child: one run, its figures written to the spec's result file."""
    import torch

    _quiet_libraries()
    spec = json.loads(spec_path.read_text())
    torch.set_num_threads(NUM_THREADS)
    files = {key: Path(value) for key, value in spec["files"].items()}
    system, output_dir = spec["system"], Path(spec["output_dir"])
    if system == "sft":
        result = run_sft(files)
    elif system == "trl":
        result = run_trl(files, output_dir, spec["variant"], spec["steps"])
    else:
        result = run_alignflow(files, output_dir, system.removeprefix("alignflow-"), spec["variant"], spec["steps"])
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(spec["result"]).write_text(json.dumps(result))


# -- parent ---------------------------------------------------------------------------------------


def read_load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def launch(system: str, variant: str, files: dict[str, Path], work_dir: Path, run_index: int, steps: int) -> dict:
    """One run in a fresh interpreter: 2 threads, passive OpenMP waits, offline (side_by_side.py's pinned setting)."""
    name = f"{run_index:03d}-{system}-{variant}"
    spec = {"system": system, "variant": variant, "steps": steps, "files": {k: str(v) for k, v in files.items()},
            "output_dir": str(work_dir / "runs" / name), "result": str(work_dir / f"{name}.result.json")}
    shutil.rmtree(spec["output_dir"], ignore_errors=True)  # an earlier sitting's, under --keep
    spec_path = work_dir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    threads = str(NUM_THREADS)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_DISABLED": "true",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    load = read_load()
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run-one", str(spec_path)], env=env,
                               check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if completed.returncode != 0:
        sys.exit(f"benchmark: {system} {variant} failed with exit status {completed.returncode}:\n"
                 + completed.stdout[-4000:])
    result = json.loads(Path(spec["result"]).read_text())
    result.update(wall_seconds=time.perf_counter() - started, load_before=load)
    return result


def figures(result: dict) -> dict[str, float]:
    seconds = result["step_seconds"]
    return {"episodes_per_second": result["episodes"] / sum(seconds), "step_seconds": statistics.median(seconds),
            **{key: result[key] for key in ("tool_calls_per_episode", "tool_error_rate", "model_tokens_per_episode",
                                            "reward", "tool_seconds_per_step", "rollout_seconds_per_step",
                                            "peak_rss_mb", "wall_seconds")}}


def format_table(results: dict[tuple[str, str], list[dict]], variants: list[str], systems: list[str]) -> str:
    header = ["variant", "system", "episodes/s", "x TRL", "step s", "rollout s", "calls/ep", "failed", "tokens/ep",
              "tool s/step", "reward", "RSS MB", "wall s"]
    cells = [header]
    for variant in variants:
        for system in systems:
            runs = results[(system, variant)]
            m = medians(runs)
            ratio = "" if system == "trl" or "trl" not in systems else \
                f"{paired_ratio(runs, results[('trl', variant)], 'episodes_per_second'):.2f}"
            cells.append([variant, system, f"{m['episodes_per_second']:.1f}", ratio, f"{m['step_seconds']:.2f}",
                          f"{m['rollout_seconds_per_step']:.2f}",
                          f"{m['tool_calls_per_episode']:.2f}", f"{m['tool_error_rate']:.0%}",
                          f"{m['model_tokens_per_episode']:.1f}", f"{m['tool_seconds_per_step']:.2f}",
                          f"{m['reward']:.2f}", f"{m['peak_rss_mb']:.0f}", f"{m['wall_seconds']:.1f}"])
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join([lines[0], "  ".join("-" * width for width in widths), *lines[1:]])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="calculator, heavy, or both.")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"A subset of {','.join(SYSTEMS)}.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each (system, variant).")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps of each `calculator` run.")
    parser.add_argument("--heavy-steps", type=int, default=3, help="GRPO steps of each `heavy` run.")
    parser.add_argument("--json", type=Path, help="Also write every run's figures here.")
    parser.add_argument("--keep", type=Path, help="Work here and keep it (the SFT model is reused when present).")
    parser.add_argument("--run-one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.variants or set(args.variants) - set(VARIANTS):
        parser.error(f"--variants {args.variants}: expected a subset of {','.join(VARIANTS)}")
    if not args.systems or set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems {args.systems}: expected a subset of {','.join(SYSTEMS)}")
    if args.repeats < 1 or args.steps < 1 or args.heavy_steps < 1:
        parser.error("--repeats, --steps and --heavy-steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_one is not None:
        run_one(args.run_one)
        return
    require_trl(args.systems)
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            work_dir = args.keep
            work_dir.mkdir(parents=True, exist_ok=True)
        else:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="alignflow-agent-trl-")))
        print(f"load average at the start: {read_load()}", flush=True)
        files = write_workload(work_dir / "workload")
        if not (files["sft_model"] / "config.json").is_file():
            sft = launch("sft", "", files, work_dir, 0, 0)
            print(f"SFT of the tiny model on the task's traces: {sft['seconds']:.0f} s", flush=True)
        results: dict[tuple[str, str], list[dict]] = {(s, v): [] for s in args.systems for v in args.variants}
        run_index = 0
        for repeat in range(args.repeats):
            for variant in args.variants:
                steps = args.heavy_steps if variant == "heavy" else args.steps
                for system in args.systems if repeat % 2 == 0 else args.systems[::-1]:
                    run_index += 1
                    raw = launch(system, variant, files, work_dir, run_index, steps)
                    result = figures(raw)
                    results[(system, variant)].append(result)
                    print(f"[{repeat + 1}/{args.repeats}] {variant:>10} {system:>18}: "
                          f"{result['episodes_per_second']:6.1f} episodes/s  step {result['step_seconds']:.2f} s "
                          f"(rollout {result['rollout_seconds_per_step']:.2f})  "
                          f"{result['tool_calls_per_episode']:.2f} calls/episode ({result['tool_error_rate']:.0%} "
                          f"failed)  {result['model_tokens_per_episode']:.1f} model tokens/episode  "
                          f"tools {result['tool_seconds_per_step']:.2f} s/step  reward {result['reward']:.2f}  "
                          f"({result['wall_seconds']:.0f} s, load {raw['load_before']})", flush=True)
    print(f"\n{EPISODES_PER_STEP} episodes a step (8 prompts x 8), up to {GRPO['environment.max_turns']} turns of "
          f"{GRPO['generation.max_new_tokens']} tokens, {GRPO['environment.max_total_tokens']} after the prompt; "
          f"steps: calculator {args.steps}, heavy {args.heavy_steps}; medians of {args.repeats}; x TRL = the median "
          f"of each repeat's own alignflow/TRL episodes/s; load average at the end: {read_load()}")
    print(format_table(results, args.variants, args.systems))
    if "trl" in args.systems:
        for variant in args.variants:
            for system in (s for s in args.systems if s != "trl"):
                ratio = paired_ratio(results[(system, variant)], results[("trl", variant)], "episodes_per_second")
                print(f"{'met   ' if ratio >= TARGET else 'MISSED'} {variant} {system} episodes/s vs TRL: "
                      f"{ratio:.2f} (>= {TARGET})")
    if args.json is not None:
        runs = [{"system": s, "variant": v, "runs": r} for (s, v), r in results.items()]
        args.json.write_text(json.dumps({"runs": runs}, indent=2))


if __name__ == "__main__":
    main()
