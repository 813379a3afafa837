"""Throughput benchmark of the supervised stages (sft, rm, dpo) on a fixed tiny workload.

    python benchmarks/supervised.py                      # or: make benchmark
    python benchmarks/supervised.py --stages dpo --steps 50 --output json
    python benchmarks/supervised.py --model-dir MODEL --sft-data sft.jsonl --pref-data pref.jsonl

Each stage trains in a fresh subprocess (this script re-invoked with the hidden `--run-one`), so
its peak RSS is its own. Per-step figures are read back from the run's `metrics.jsonl`
(`perf/tokens_per_second` counts real, non-pad tokens) after dropping the first `WARMUP_STEPS`;
checkpoint saves happen outside the timed step and are therefore excluded. Peak RSS is the whole
child process (imports, model load, data, saves). DPO starts from the raw model, not an SFT'd one:
fine for speed, meaningless for quality. Not measured: evaluation, multi-process runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# -- the workload (swap the model and data with --model-dir / --sft-data / --pref-data) ----------
HIDDEN_SIZE = 128  # tiny Llama from trainer.tiny.model: 4 heads (2 kv heads), MLP 2 x hidden
NUM_LAYERS = 4
MAX_LENGTH = 64  # tokens per sample after truncation; the addition task's samples are ~10 tokens
MICRO_BATCH_SIZE = 16  # samples (sft) or chosen/rejected pairs (rm, dpo) per step, no accumulation
NUM_STEPS = 30  # optimizer steps per stage
WARMUP_STEPS = 5  # first steps left out of the statistics
LR = 1e-3
STAGES = ("sft", "rm", "dpo")


# -- child: train one stage ----------------------------------------------------------------------


def run_one(spec_path: Path) -> None:
    """Train the stage described by a spec file and write the process's peak RSS next to its metrics."""
    from trainer.config import build_config
    from trainer.stages import run_stage

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    spec = json.loads(spec_path.read_text())
    run_stage(build_config(spec["stage"], spec["config"]))
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    (Path(spec["config"]["output_dir"]) / "peak_rss.json").write_text(json.dumps({"peak_rss_mb": peak}))


# -- parent: prepare, launch, summarise ----------------------------------------------------------


def stage_config(stage: str, args: argparse.Namespace, data_path: Path, output_dir: Path) -> dict:
    return {
        "output_dir": str(output_dir),
        "model": {"path": str(args.model_dir)},
        "data": {"train_path": str(data_path), "max_length": MAX_LENGTH},
        "optimizer": {"lr": LR},
        # Epochs are bounded by max_steps; a large max_epochs just lets small datasets wrap around.
        "train": {"max_epochs": 100_000, "max_steps": args.steps, "micro_batch_size": args.micro_batch_size,
                  "log_interval": 1, "seed": args.seed},
        "checkpoint": {"keep_last": 1, "save_interval": 0},
    }


def prepare_workload(args: argparse.Namespace, work_dir: Path) -> dict[str, Path]:
    """Write the tiny model and task data unless given; fill `args.model_dir`; return data by stage."""
    if args.model_dir is None:
        from trainer.tiny.model import write_tiny_model

        args.model_dir = write_tiny_model(work_dir / "model", hidden_size=HIDDEN_SIZE, num_layers=NUM_LAYERS,
                                          seed=args.seed)
    if args.sft_data is None or args.pref_data is None:
        from trainer.tiny.task import write_task

        written = write_task(work_dir / "data", seed=args.seed)
        args.sft_data = args.sft_data or written["sft_train"]
        args.pref_data = args.pref_data or written["pref_train"]
    return {"sft": Path(args.sft_data), "rm": Path(args.pref_data), "dpo": Path(args.pref_data)}


def launch_stage(stage: str, config: dict, work_dir: Path) -> Path:
    """Run one stage in a fresh interpreter; returns its output directory."""
    spec_path = work_dir / f"{stage}.json"
    spec_path.write_text(json.dumps({"stage": stage, "config": config}))
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run-one", str(spec_path)], check=True)
    return Path(config["output_dir"])


def percentile(values: list[float], fraction: float) -> float:
    """Linear-interpolated percentile of a non-empty list (numpy's default method)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(stage: str, output_dir: Path) -> dict:
    """Per-stage figures over the logged steps after warm-up; throughput is total work / total time."""
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "perf/step_time" in row and row["step"] > WARMUP_STEPS]
    seconds = [row["perf/step_time"] for row in steps]
    total = sum(seconds)
    tokens = sum(row["perf/tokens_per_second"] * row["perf/step_time"] for row in steps)
    samples = sum(row["perf/samples_per_second"] * row["perf/step_time"] for row in steps)
    peak = json.loads((output_dir / "peak_rss.json").read_text())["peak_rss_mb"]
    return {
        "stage": stage, "measured_steps": len(steps), "tokens_per_second": tokens / total,
        "samples_per_second": samples / total, "peak_rss_mb": peak,
        "step_ms_mean": 1000 * statistics.fmean(seconds), "step_ms_p50": 1000 * percentile(seconds, 0.5),
        "step_ms_p90": 1000 * percentile(seconds, 0.9), "final_loss": steps[-1]["loss"],
    }


COLUMNS = [("stage", "stage", "{}"), ("tokens_per_second", "tokens/s", "{:.0f}"),
           ("samples_per_second", "samples/s", "{:.1f}"), ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
           ("step_ms_mean", "step mean ms", "{:.1f}"), ("step_ms_p50", "p50 ms", "{:.1f}"),
           ("step_ms_p90", "p90 ms", "{:.1f}"), ("final_loss", "loss", "{:.4f}")]


def format_table(results: list[dict]) -> str:
    cells = [[header for _, header, _ in COLUMNS]]
    cells += [[fmt.format(result[key]) for key, _, fmt in COLUMNS] for result in results]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * width for width in widths), *lines[1:]])


def describe_workload(args: argparse.Namespace, is_default_model: bool) -> str:
    model = f"tiny Llama hidden={HIDDEN_SIZE} layers={NUM_LAYERS}" if is_default_model else str(args.model_dir)
    return (f"model: {model}; max_length={MAX_LENGTH}; micro_batch_size={args.micro_batch_size}; "
            f"steps={args.steps} (first {WARMUP_STEPS} not measured); seed={args.seed}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default=",".join(STAGES), help="Comma-separated subset of sft,rm,dpo.")
    parser.add_argument("--steps", type=int, default=NUM_STEPS, help="Optimizer steps per stage.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the tiny model, the task data and training.")
    parser.add_argument("--micro-batch-size", type=int, default=MICRO_BATCH_SIZE, help="Samples or pairs per step.")
    parser.add_argument("--model-dir", type=Path, help="HF model + tokenizer directory; default: the tiny model.")
    parser.add_argument("--sft-data", type=Path, help="SFT JSONL (prompt/completion or messages) for sft.")
    parser.add_argument("--pref-data", type=Path, help="Preference JSONL (prompt/chosen/rejected) for rm and dpo.")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--run-one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.stages = [stage.strip() for stage in args.stages.split(",") if stage.strip()]
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown or not args.stages:
        parser.error(f"--stages {','.join(args.stages)!r}: unknown {unknown}, expected a subset of {','.join(STAGES)}")
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps is {args.steps}, expected > {WARMUP_STEPS} (the warm-up steps left out)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_one is not None:
        run_one(args.run_one)
        return
    is_default_model = args.model_dir is None
    with tempfile.TemporaryDirectory(prefix="alignflow-bench-") as temp:
        work_dir = Path(temp)
        data = prepare_workload(args, work_dir)
        results = []
        for stage in args.stages:
            config = stage_config(stage, args, data[stage], work_dir / "runs" / stage)
            results.append(summarise(stage, launch_stage(stage, config, work_dir)))
    workload = describe_workload(args, is_default_model)
    if args.output == "json":
        print(json.dumps({"workload": workload, "results": results}, indent=2))
    else:
        print(workload + "\n" + format_table(results))


if __name__ == "__main__":
    main()
