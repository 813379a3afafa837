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
MAX_LENGTH = 64  # tokens per sequence after truncation; the addition task's are ~7 tokens
MICRO_BATCH_SIZE = 16  # samples (sft) or chosen/rejected pairs (rm, dpo) per step, no accumulation
NUM_THREADS = 1  # torch intra-op threads; on tiny ops more threads mostly add contention and noise
NUM_STEPS = 30  # optimizer steps per stage
WARMUP_STEPS = 5  # first steps left out of the statistics
LR = 1e-3
STAGES = ("sft", "rm", "dpo")


# -- child: train one stage ----------------------------------------------------------------------


def quiet_libraries() -> None:
    """Keep trainer and Hugging Face messages and progress bars out of the benchmark's output."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()


def run_one(spec_path: Path) -> None:
    """Train the stage described by a spec file and write the process's peak RSS next to its metrics."""
    from trainer.config import build_config
    from trainer.supervised.stages import run_stage

    quiet_libraries()
    spec = json.loads(spec_path.read_text())
    run_stage(build_config(spec["stage"], spec["config"]))
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    (Path(spec["config"]["output_dir"]) / "peak_rss.json").write_text(json.dumps({"peak_rss_mb": peak}))


# -- parent: prepare, launch, summarise ----------------------------------------------------------


def stage_config(args: argparse.Namespace, model_dir: Path, data_path: Path, output_dir: Path) -> dict:
    """The raw config of one measured run, as `trainer.config.build_config` takes it."""
    return {
        "output_dir": str(output_dir),
        "model": {"path": str(model_dir)},
        "data": {"train_path": str(data_path), "max_length": MAX_LENGTH},
        "optimizer": {"lr": LR},
        # Epochs are bounded by max_steps; a large max_epochs just lets small datasets wrap around.
        "train": {"max_epochs": 100_000, "max_steps": args.steps, "micro_batch_size": args.micro_batch_size,
                  "log_interval": 1, "seed": args.seed, "num_threads": args.num_threads or None},
        "checkpoint": {"keep_last": 1, "save_interval": 0},
        "tracking": {"backend": "none"},
    }


def prepare_workload(args: argparse.Namespace, work_dir: Path) -> tuple[Path, dict[str, Path]]:
    """Write the tiny model and task data where no flag gives them; return the model and data by stage."""
    model_dir, sft_data, pref_data = args.model_dir, args.sft_data, args.pref_data
    if model_dir is None:
        from trainer.tiny.model import write_tiny_model

        model_dir = write_tiny_model(work_dir / "model", hidden_size=HIDDEN_SIZE, num_layers=NUM_LAYERS,
                                     seed=args.seed)
    if sft_data is None or pref_data is None:
        from trainer.tiny.task import write_task

        written = write_task(work_dir / "data", seed=args.seed)
        sft_data, pref_data = sft_data or written["sft_train"], pref_data or written["pref_train"]
    return model_dir, {"sft": sft_data, "rm": pref_data, "dpo": pref_data}


def launch_stage(stage: str, config: dict, work_dir: Path) -> Path:
    """Run one stage in a fresh interpreter; returns its output directory."""
    spec_path = work_dir / f"{stage}.json"
    spec_path.write_text(json.dumps({"stage": stage, "config": config}))
    command = [sys.executable, str(Path(__file__).resolve()), "--run-one", str(spec_path)]
    returncode = subprocess.run(command, check=False).returncode
    if returncode != 0:
        sys.exit(f"benchmark: stage {stage} failed with exit status {returncode}; its error is above")
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
    """Right-aligned columns with a header rule, one row per stage."""
    cells = [[header for _, header, _ in COLUMNS]]
    cells += [[fmt.format(result[key]) for key, _, fmt in COLUMNS] for result in results]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * width for width in widths), *lines[1:]])


def describe_workload(args: argparse.Namespace) -> dict:
    """What was measured, printed above the table so a figure is never quoted without its workload."""
    default_model = f"tiny Llama hidden={HIDDEN_SIZE} layers={NUM_LAYERS}"
    return {"model": str(args.model_dir or default_model), "max_length": MAX_LENGTH,
            "micro_batch_size": args.micro_batch_size, "steps": args.steps, "warmup_steps": WARMUP_STEPS,
            "seed": args.seed, "threads": args.num_threads or "train.num_threads default"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; `--run-one` (hidden) marks the child that trains one stage."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--stages", default=",".join(STAGES), help="Comma-separated subset of sft,rm,dpo.")
    parser.add_argument("--steps", type=int, default=NUM_STEPS, help="Optimizer steps per stage.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the tiny model, the task data and training.")
    parser.add_argument("--micro-batch-size", type=int, default=MICRO_BATCH_SIZE, help="Samples or pairs per step.")
    parser.add_argument("--num-threads", type=int, default=NUM_THREADS, help="train.num_threads; 0 leaves it to its default (the CPUs available).")
    parser.add_argument("--model-dir", type=Path, help="HF model + tokenizer directory; default: the tiny model.")
    parser.add_argument("--sft-data", type=Path, help="SFT JSONL (prompt/completion or messages) for sft.")
    parser.add_argument("--pref-data", type=Path, help="Preference JSONL (prompt/chosen/rejected) for rm and dpo.")
    parser.add_argument("--output", choices=("table", "json"), default="table", help="Summary format on stdout.")
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
    """Measure the chosen stages one subprocess at a time and print the summary."""
    args = parse_args(argv)
    if args.run_one is not None:
        run_one(args.run_one)
        return
    quiet_libraries()
    with tempfile.TemporaryDirectory(prefix="alignflow-bench-") as temp:
        work_dir = Path(temp)
        model_dir, data = prepare_workload(args, work_dir)
        results = []
        for stage in args.stages:
            config = stage_config(args, model_dir, data[stage], work_dir / "runs" / stage)
            results.append(summarise(stage, launch_stage(stage, config, work_dir)))
    workload = describe_workload(args)
    if args.output == "json":
        print(json.dumps({"workload": workload, "results": results}, indent=2))
    else:
        print("; ".join(f"{key}={value}" for key, value in workload.items()) + "\n" + format_table(results))


if __name__ == "__main__":
    main()
