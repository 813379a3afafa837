"""`make demo`: SFT -> reward model -> DPO on the tiny addition task, through `python -m trainer`.

Builds the tiny model, tokenizer and data offline, writes one config per stage, runs each stage as
the command a PyTorchJob would run, and ends with a summary: per stage its time, key metrics and
where its model is, and the checkable reward (greedy accuracy) before and after training.
Re-running resumes each stage from its latest checkpoint, so a finished stage only re-exports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from trainer.tiny.evaluate import checkable_accuracy
from trainer.tiny.model import write_tiny_model
from trainer.tiny.task import write_task


def stage_configs(out: Path, data: dict[str, Path], base_model: Path) -> dict[str, dict]:
    def common(stage: str, model: Path, train: str, evaluation: str, lr: float, epochs: int) -> dict:
        return {
            "output_dir": str(out / stage),
            "model": {"path": str(model)},
            "data": {"train_path": str(data[train]), "eval_path": str(data[evaluation]), "max_length": 32},
            "optimizer": {"lr": lr, "warmup_steps": 5},
            "train": {"max_epochs": epochs, "micro_batch_size": 16, "log_interval": 25},
            "checkpoint": {"save_interval": 50, "keep_last": 2},
        }

    sft_model = out / "sft" / "model"
    return {
        "sft": common("sft", base_model, "sft_train", "sft_eval", 3e-3, 20),
        "rm": common("rm", sft_model, "pref_train", "pref_eval", 1e-3, 15),
        "dpo": {**common("dpo", sft_model, "pref_train", "pref_eval", 5e-4, 2), "dpo": {"beta": 0.1}},
    }


def run_stage(stage: str, config: dict, config_dir: Path) -> float:
    path = config_dir / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"\n=== {stage}: python -m trainer {stage} --config {path}", flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer", stage, "--config", str(path)], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="Where models, data and runs go.")
    args = parser.parse_args()
    out = args.out.resolve()
    base_model = write_tiny_model(out / "base-model")
    data = write_task(out / "data")
    configs = stage_configs(out, data, base_model)
    (out / "configs").mkdir(parents=True, exist_ok=True)
    try:
        seconds = {stage: run_stage(stage, config, out / "configs") for stage, config in configs.items()}
    except subprocess.CalledProcessError as err:
        print(f"demo failed: {' '.join(err.cmd)} exited with {err.returncode}", file=sys.stderr)
        return 1

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    metrics = {stage: json.loads((out / stage / "final_metrics.json").read_text()) for stage in configs}
    accuracy = {name: checkable_accuracy(path, data["prompts"])
                for name, path in [("base", base_model), ("sft", out / "sft" / "model"), ("dpo", out / "dpo" / "model")]}
    key_metrics = {
        "sft": f"eval loss {metrics['sft']['eval/loss']:.3f}, checkable reward {accuracy['sft']:.2f}",
        "rm": f"held-out pair accuracy {metrics['rm']['eval/accuracy']:.2f}, margin {metrics['rm']['eval/rewards/margins']:.2f}",
        "dpo": f"held-out reward accuracy {metrics['dpo']['eval/rewards/accuracies']:.2f}, "
               f"checkable reward {accuracy['dpo']:.2f}",
    }
    print("\n=== summary")
    print(f"{'stage':<6} {'time':>7}  {'key metrics':<62} model")
    for stage in configs:
        print(f"{stage:<6} {seconds[stage]:>6.1f}s  {key_metrics[stage]:<62} {out / stage / 'model'}")
    print(f"\ncheckable reward (greedy accuracy on {data['prompts'].name}): "
          f"base {accuracy['base']:.2f} -> sft {accuracy['sft']:.2f} -> dpo {accuracy['dpo']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
