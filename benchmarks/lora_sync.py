"""A LoRA actor's weight sync into vLLM, both ways: the adapter alone (`rollout.vllm.lora_sync: adapter`) against
the merged full weights (`merged`), and what each costs at sampling.

    .venv-vllm/bin/python benchmarks/lora_sync.py                 # both models, 2 repeats
    .venv-vllm/bin/python benchmarks/lora_sync.py --models large --rank 16 --json out.json

Runs in the environment of `make test-vllm`. The models are `rollout_engines.py`'s (`small`: 3.2M parameters,
4 x 256; `large`: 96M, 8 x 1024), with LoRA (PEFT, `model.lora`: rank `--rank`, alpha 2r, on q/k/v/o) and a
trained-looking adapter (B drawn at random; a fresh one is zero). Each measured run is its own interpreter that
builds the engine as the online stages do (fp32, `rollout.num_threads` 1), then:

- sync: `--syncs` pushes of the actor into the engine (`sync_from`, what each episode starts with), the median
  time of one, and the most it raised the process's resident memory (peak RSS, reset before each push
  through /proc/self/clear_refs, minus the RSS before it);
- sampling: `--batches` batches of `--prompts` prompts x `--samples` samples x up to `--new-tokens` tokens at
  temperature 1 after the last push, in completions/s: the adapter's products on every decode step;
- an episode: one push plus one batch, the figure `lora_sync: auto` was chosen by.

The two ways alternate within each repeat; the summary gives medians and adapter/merged ratios per repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.rollout_engines import run_child, write_model  # noqa: E402

MODES = ("merged", "adapter")


def resident_mb(field: str) -> float:
    """`VmRSS` or `VmHWM` (peak) of this process in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Make the peak RSS (VmHWM) restart from the current RSS (Linux's clear_refs, value 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def run_one(spec: dict) -> dict:
    """One sync mode on one model in this interpreter; returns its figures."""
    import torch

    from trainer.config import GenerationConfig, LoraConfig, ModelConfig, RolloutConfig, VLLMConfig
    from trainer.data.tokenize import encode_prompt
    from trainer.modeling.models import load_causal_lm, load_tokenizer
    from trainer.rollout.engine_registry import build_rollout_engine
    from trainer.rollout.engines import EngineSetup
    from trainer.rollout.single_turn import sample

    torch.set_num_threads(spec["threads"])
    model_dir = spec["model"]
    lora = LoraConfig(r=spec["rank"], alpha=2.0 * spec["rank"])
    policy = load_causal_lm(ModelConfig(path=model_dir, lora=lora)).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
    tokenizer = load_tokenizer(model_dir)
    rollout = RolloutConfig(engine="vllm", num_threads=1, vllm=VLLMConfig(lora_sync=spec["mode"]))
    started = time.perf_counter()
    engine = build_rollout_engine(rollout, policy, EngineSetup(model_dir, lora=lora))
    start_seconds = time.perf_counter() - started
    assert (getattr(engine, "adapter", None) is not None) == (spec["mode"] == "adapter")
    sync_seconds, sync_mb = [], []
    for _ in range(spec["syncs"]):
        before = resident_mb("VmRSS")
        reset_peak()
        started = time.perf_counter()
        engine.sync_from(policy)
        sync_seconds.append(time.perf_counter() - started)
        sync_mb.append(resident_mb("VmHWM") - before)
    options = GenerationConfig(max_new_tokens=spec["new_tokens"], temperature=1.0)
    prompts = [encode_prompt(tokenizer, f"{a}+{a * 7 % 50}=") for a in range(spec["prompts"])]
    rows = [prompt for prompt in prompts for _ in range(spec["samples"])]
    sample(engine, tokenizer, rows[:8], options, torch.device("cpu"))  # warm-up (first-call costs)
    seconds = 0.0
    for _ in range(spec["batches"]):
        started = time.perf_counter()
        sample(engine, tokenizer, rows, options, torch.device("cpu"))
        seconds += time.perf_counter() - started
    engine.close()
    batch_seconds = seconds / spec["batches"]
    return {"start_seconds": start_seconds, "sync_seconds": statistics.median(sync_seconds),
            "sync_peak_mb": max(sync_mb), "batch_seconds": batch_seconds,
            "completions_per_second": len(rows) / batch_seconds,
            "episode_seconds": statistics.median(sync_seconds) + batch_seconds}


def measure(spec: dict, work_dir: Path) -> dict:
    """`run_one` in a fresh interpreter."""
    return run_child(__file__, spec, f"{spec['model_name']}-{spec['mode']}-{spec['repeat']}", work_dir)


def summarise(results: list[dict]) -> str:
    """Medians per (model, mode), and per repeat the adapter/merged ratios of sync time and episode time."""
    keys = ("start_seconds", "sync_seconds", "sync_peak_mb", "completions_per_second", "episode_seconds")
    lines = [f"{'model':>6}  {'sync':>8}  {'start s':>7}  {'sync s':>7}  {'sync MB':>7}  {'compl/s':>7}  "
             f"{'episode s':>9}  adapter/merged per repeat: sync time, episode time"]
    for model in dict.fromkeys(r["model_name"] for r in results):
        for mode in MODES:
            rows = [r for r in results if r["model_name"] == model and r["mode"] == mode]
            median = {key: statistics.median(r[key] for r in rows) for key in keys}
            ratios = ""
            if mode == "adapter":
                merged = {r["repeat"]: r for r in results if r["model_name"] == model and r["mode"] == "merged"}
                ratios = "; ".join(f"{r['sync_seconds'] / merged[r['repeat']]['sync_seconds']:.2f}, "
                                   f"{r['episode_seconds'] / merged[r['repeat']]['episode_seconds']:.2f}"
                                   for r in rows if r["repeat"] in merged)
            lines.append(f"{model:>6}  {mode:>8}  {median['start_seconds']:7.1f}  {median['sync_seconds']:7.3f}  "
                         f"{median['sync_peak_mb']:7.0f}  {median['completions_per_second']:7.1f}  "
                         f"{median['episode_seconds']:9.2f}  {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small,large", help="comma-separated: small, large")
    parser.add_argument("--rank", type=int, default=8, help="model.lora.r (alpha is 2r)")
    parser.add_argument("--syncs", type=int, default=5, help="measured pushes per run")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (GRPO's group)")
    parser.add_argument("--new-tokens", type=int, default=64, help="longest response")
    parser.add_argument("--batches", type=int, default=2, help="measured batches per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads of each child")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        spec = json.loads(Path(args.run_one).read_text())
        Path(spec["result"]).write_text(json.dumps(run_one(spec)))
        return
    results = []
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        for model_name in args.models.split(","):
            model_dir = write_model(model_name, work_dir)
            for repeat in range(args.repeats):
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:  # alternate who goes first
                    spec = {"model": str(model_dir), "model_name": model_name, "mode": mode, "repeat": repeat,
                            "rank": args.rank, "syncs": args.syncs, "prompts": args.prompts,
                            "samples": args.samples, "new_tokens": args.new_tokens, "batches": args.batches,
                            "threads": args.threads}
                    result = {**spec, **measure(spec, work_dir)}
                    print(json.dumps(result), file=sys.stderr)
                    results.append(result)
    print(summarise(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
