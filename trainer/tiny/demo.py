"""`make demo`: SFT, then reward model, DPO, PPO and GRPO on the tiny addition task, via `python -m trainer`.

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

    def online(stage: str, options: dict) -> dict:
        config = common(stage, sft_model, "prompts", "prompts", 5e-4, 1)
        config["optimizer"]["scheduler"] = "constant"
        config["train"]["micro_batch_size"] = 64
        config["checkpoint"]["save_interval"] = 10
        # The task's checker is the reward: a reward model this small is easy to exploit (see README).
        return {**config, "generation": {"max_new_tokens": 4, "temperature": 0.7},
                "reward": {"function": "trainer.tiny.task:reward"}, stage: options}

    sft_model = out / "sft" / "model"
    return {
        "sft": common("sft", base_model, "sft_train", "sft_eval", 3e-3, 20),
        "rm": common("rm", sft_model, "pref_train", "pref_eval", 1e-3, 15),
        "dpo": {**common("dpo", sft_model, "pref_train", "pref_eval", 5e-4, 2), "dpo": {"beta": 0.1}},
        "ppo": online("ppo", {"num_episodes": 40, "rollout_batch_size": 256, "mini_batch_size": 64,
                              "kl_coef": 0.02, "critic_lr": 1e-3}),
        "grpo": online("grpo", {"num_episodes": 40, "rollout_batch_size": 32, "num_generations": 8,
                                "mini_batch_size": 64}),
    }


def run_stage(stage: str, config: dict, config_dir: Path) -> float:
    path = config_dir / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"\n=== {stage}: python -m trainer {stage} --config {path}", flush=True)
    started = time.perf_counter()
    # Run inside the output folder so MLflow's embedded default (./mlflow.db, ./mlruns) lands there.
    subprocess.run([sys.executable, "-m", "trainer", stage, "--config", str(path)], check=True, cwd=config_dir.parent)
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
    policies = [("base", base_model)] + [(s, out / s / "model") for s in ("sft", "dpo", "ppo", "grpo")]
    accuracy = {name: checkable_accuracy(path, data["prompts"]) for name, path in policies}
    key_metrics = {
        "sft": f"eval loss {metrics['sft']['eval/loss']:.3f}, checkable reward {accuracy['sft']:.2f}",
        "rm": f"held-out pair accuracy {metrics['rm']['eval/accuracy']:.2f}, margin {metrics['rm']['eval/rewards/margins']:.2f}",
        "dpo": f"held-out reward accuracy {metrics['dpo']['eval/rewards/accuracies']:.2f}, "
               f"checkable reward {accuracy['dpo']:.2f}",
    }
    for stage in ("ppo", "grpo"):
        key_metrics[stage] = (f"sampled reward {_first_and_last_reward(out / stage)}, "
                              f"checkable reward {accuracy[stage]:.2f}")
    print("\n=== summary")
    print(f"{'stage':<6} {'time':>7}  {'key metrics':<62} model")
    for stage in configs:
        print(f"{stage:<6} {seconds[stage]:>6.1f}s  {key_metrics[stage]:<62} {out / stage / 'model'}")
    print(f"\ncheckable reward (greedy accuracy on {data['prompts'].name}): base {accuracy['base']:.2f} -> "
          f"sft {accuracy['sft']:.2f} -> " + ", ".join(f"{s} {accuracy[s]:.2f}" for s in ("dpo", "ppo", "grpo")))
    print(f"MLflow runs: mlflow ui --backend-store-uri sqlite:///{out / 'mlflow.db'}")
    return 0


def _first_and_last_reward(run_dir: Path) -> str:
    """Mean training reward of the first and the last five episodes, as 'a -> b'."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["episode/reward_mean"] for line in lines if "episode/reward_mean" in line]
    return f"{sum(rewards[:5]) / 5:.2f} -> {sum(rewards[-5:]) / 5:.2f}"


if __name__ == "__main__":
    sys.exit(main())
