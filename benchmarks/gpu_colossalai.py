"""A few SFT steps through each ColossalAI plugin on GPUs: loss and step time per plugin.

    torchrun --nproc_per_node=2 benchmarks/gpu_colossalai.py
    torchrun --nproc_per_node=1 benchmarks/gpu_colossalai.py --plugins low_level_zero gemini --steps 20
    torchrun --nproc_per_node=4 benchmarks/gpu_colossalai.py --model-dir MODEL --sft-data sft.jsonl --tp-size 2

Run it in the ColossalAI environment (`.venv-colossalai` from `make test-colossalai`, or the
`VARIANT=colossalai` trainer image) on a machine with CUDA. Each plugin trains the same SFT run
in this process through `parallel.plugin: colossalai` (`trainer.parallel.colossalai_booster`), one after the
other; rank 0 prints one row per plugin: the first and last logged loss, the mean step time after
`WARMUP_STEPS`, and peak GPU memory. A plugin that fails prints its error on one line and the
next one runs. `gemini` needs ColossalAI's CUDA kernels (HybridAdam), which it compiles on first
use: that needs nvcc (a `-devel` CUDA image). The default workload is the tiny Llama and the
addition task of `trainer.tiny`: it checks that every plugin trains, not how fast a real model is.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

PLUGINS = ("torch_ddp", "low_level_zero", "gemini", "hybrid_parallel")
HIDDEN_SIZE = 128
NUM_LAYERS = 4
MICRO_BATCH_SIZE = 16
NUM_STEPS = 10
WARMUP_STEPS = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugins", nargs="+", choices=PLUGINS, default=list(PLUGINS))
    parser.add_argument("--steps", type=int, default=NUM_STEPS, help="optimizer steps per plugin")
    parser.add_argument("--tp-size", type=int, default=None,
                        help="hybrid_parallel's tensor-parallel degree; default 2 with an even number of GPUs, else 1")
    parser.add_argument("--model-dir", type=Path, help="an HF causal LM directory instead of the tiny Llama")
    parser.add_argument("--sft-data", type=Path, help="SFT rows (prompt/completion JSONL) instead of the tiny task")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "alignflow-gpu-colossalai",
                        help="where the tiny model, data and runs go (one directory all ranks of the node see)")
    return parser.parse_args()


def plugin_options(name: str, tp_size: int) -> dict:
    if name == "low_level_zero":
        return {"plugin": name, "zero_stage": 2}
    if name == "hybrid_parallel":
        return {"plugin": name, "tp_size": tp_size, "zero_stage": 1}
    return {"plugin": name}


def run_plugin(name: str, args: argparse.Namespace, model_dir: Path, data: Path, work: Path, tp_size: int) -> dict:
    """Train `args.steps` SFT steps through one ColossalAI plugin; its losses and step times (rank 0)."""
    import torch

    from trainer.config import build_config
    from trainer.supervised.stages import run_stage

    output = work / name
    config = build_config("sft", {
        "output_dir": str(output), "model": {"path": str(model_dir)},
        "data": {"train_path": str(data), "max_length": 64},
        "optimizer": {"lr": 1e-3, "warmup_steps": 0, "scheduler": "constant"},
        "train": {"micro_batch_size": MICRO_BATCH_SIZE, "max_steps": args.steps, "max_epochs": 1000,
                  "log_interval": 1, "mixed_precision": "auto"},
        "checkpoint": {"keep_last": 1}, "tracking": {"backend": "none"},
        "parallel": {"plugin": "colossalai", "colossalai": plugin_options(name, tp_size)},
    })
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    run_stage(config)
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()] \
        if (output / "metrics.jsonl").is_file() else []
    rows = [row for row in rows if "loss" in row]
    times = [row["perf/step_time"] for row in rows[WARMUP_STEPS:]] or [row["perf/step_time"] for row in rows]
    return {"plugin": name, "loss_first": rows[0]["loss"] if rows else None,
            "loss_last": rows[-1]["loss"] if rows else None, "steps": len(rows),
            "step_ms": 1000 * statistics.mean(times) if times else None,
            "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0, "wall_s": time.perf_counter() - started}


def main() -> None:
    import torch
    import torch.distributed as dist

    from trainer.runtime import init_process_group, pick_device, read_distributed_env, setup_logging
    from trainer.tiny.model import write_tiny_model
    from trainer.tiny.task import write_task

    args = parse_args()
    env = read_distributed_env()
    setup_logging(env)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    if not torch.cuda.is_available() and args.plugins != ["torch_ddp"]:
        raise SystemExit("gpu_colossalai.py needs CUDA; on CPU only `--plugins torch_ddp` runs (a smoke test)")
    init_process_group(env, pick_device(env))
    tp_size = args.tp_size or (2 if env.world_size % 2 == 0 else 1)
    work = args.work_dir
    model_dir = args.model_dir or work / "model"
    data = args.sft_data or work / "task" / "sft_train.jsonl"
    if env.is_main_process:  # one node: every rank reads what rank 0 wrote
        if args.model_dir is None:
            write_tiny_model(model_dir, hidden_size=HIDDEN_SIZE, num_layers=NUM_LAYERS)
        if args.sft_data is None:
            write_task(work / "task")
    if dist.is_initialized():
        dist.barrier()
    results = []
    for name in args.plugins:
        if env.is_main_process:
            shutil.rmtree(work / "runs" / name, ignore_errors=True)  # a fresh run, not a resume of the last one
        if dist.is_initialized():
            dist.barrier()
        try:
            results.append(run_plugin(name, args, model_dir, data, work / "runs", tp_size))
        except Exception as err:  # one plugin's failure is a result too; the next one runs
            results.append({"plugin": name, "error": f"{type(err).__name__}: {err}".splitlines()[0][:300]})
        if dist.is_initialized():
            dist.barrier()
    if env.is_main_process:
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        print_results(results, env.world_size, tp_size, device_name)
    if dist.is_initialized():
        dist.destroy_process_group()


def print_results(results: list[dict], world_size: int, tp_size: int, device_name: str) -> None:
    print(f"world size {world_size}, tp_size {tp_size}, {device_name}")
    print(f"{'plugin':<16}{'loss first':>12}{'loss last':>12}{'steps':>7}{'step ms':>10}{'peak MB':>10}")
    for row in results:
        if "error" in row:
            print(f"{row['plugin']:<16}  FAILED {row['error']}")
            continue
        print(f"{row['plugin']:<16}{row['loss_first']:>12.4f}{row['loss_last']:>12.4f}{row['steps']:>7}"
              f"{row['step_ms']:>10.1f}{row['peak_gpu_mb']:>10.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
