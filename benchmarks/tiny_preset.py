"""Tune a preset of the tiny demo: run each pipeline's stages in-process over several seeds.

    python benchmarks/tiny_preset.py --pipelines rlhf-dpo --seeds 42 1 2
    python benchmarks/tiny_preset.py --pipelines rlhf-ppo --set ppo_kl_coef=0.1 --set ppo_episodes=80
    python benchmarks/tiny_preset.py --pipelines rlhf-dpo --set 'dpo_settings={"dpo.rpo_alpha": null}'
    python benchmarks/tiny_preset.py --preset tiny-reward-hacking --pipelines rlhf-ppo

Each pipeline runs as its stages would run in `alignflow run --preset ...`: the same component
defaults, the same parameter-to-config mapping (`components.launcher.component_io.stage_config`)
and the same evaluation (`trainer.online.evaluate.run_evaluation`: greedy answers of the candidate
and of the SFT baseline on the held-out prompts, scored by the task's checker), but in this
process, without kfp.local, torchrun or MLflow, which makes a run several times faster. Only
`train.seed` changes between seeds (the tiny model's initial weights stay those of the preset).
The SFT and reward models of a seed are trained once per root and parameters and then reused: use
a fresh `--root` after changing the trainer. `benchmarks/tiny_preset.md` is the log of the tuning.

Prints one JSON line per pipeline and seed, then the mean and range of the improvement per pipeline.
At seed 42 (the pipelines' default `train.seed`) its numbers equal those of `alignflow run`.
Not measured: anything the real pipeline adds (caching, the registration gate itself, tracking).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Pipeline parameter -> (stage, component parameter), as the pipelines wire them.
STAGE_PARAMETERS = {
    "sft": {"sft_lr": "lr", "sft_epochs": "max_epochs", "sft_settings": "settings"},
    "dpo": {"dpo_lr": "lr", "dpo_epochs": "max_epochs", "dpo_beta": "beta", "dpo_settings": "settings"},
    "kto": {"kto_lr": "lr", "kto_epochs": "max_epochs", "kto_beta": "beta", "kto_desirable_weight": "desirable_weight",
            "kto_undesirable_weight": "undesirable_weight", "kto_settings": "settings"},
    "orpo": {"orpo_lr": "lr", "orpo_epochs": "max_epochs", "orpo_beta": "beta", "orpo_settings": "settings"},
    "rm": {"rm_lr": "lr", "rm_epochs": "max_epochs", "rm_settings": "settings"},
    "ppo": {"ppo_lr": "lr", "ppo_episodes": "num_episodes", "ppo_kl_coef": "kl_coef",
            "ppo_reward_function": "reward_function", "ppo_settings": "settings"},
    "grpo": {"grpo_lr": "lr", "grpo_episodes": "num_episodes", "grpo_generations": "num_generations",
             "grpo_settings": "settings", "reward_function": "reward_function", "environment": "environment"},
}
STAGES = {"rlhf-dpo": ("dpo",), "rlhf-ppo": ("rm", "ppo"), "rlhf-grpo": ("grpo",), "rlhf-kto": ("kto",),
          "rlhf-orpo": ("orpo",), "rlhf-agent": ("grpo",)}
# The datasets a stage trains and evaluates on (pipeline parameters), as the pipelines wire them.
STAGE_DATA = {"kto": ("unpaired_train_uri", "unpaired_eval_uri"), "ppo": ("prompts_uri", "eval_prompts_uri"),
              "grpo": ("prompts_uri", "eval_prompts_uri")}


def component_defaults(stage: str) -> dict[str, Any]:
    """The defaults of a training component's parameters (what the pipeline leaves unset)."""
    from components.dpo.component import train_dpo
    from components.grpo.component import train_grpo
    from components.kto.component import train_kto
    from components.orpo.component import train_orpo
    from components.ppo.component import train_ppo
    from components.rm.component import train_reward_model
    from components.sft.component import train_sft

    function = {"sft": train_sft, "rm": train_reward_model, "dpo": train_dpo, "kto": train_kto, "orpo": train_orpo,
                "ppo": train_ppo, "grpo": train_grpo}[stage].python_func
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def stage_config_for(stage: str, arguments: dict[str, Any], artifacts: dict[str, str], seed: int,
                     output_dir: Path) -> dict:
    """The stage config the pipeline's component would write, with `train.seed` and no tracking."""
    from components.launcher.component_io import stage_config

    params = component_defaults(stage)
    params.update({component: arguments[name] for name, component in STAGE_PARAMETERS[stage].items()
                   if name in arguments})
    params.update({name: SimpleNamespace(uri=uri) for name, uri in artifacts.items()})
    if stage == "sft":  # SFT reads the base model straight from its URI
        params["base_model_uri"] = arguments["base_model_uri"]
    params["settings"] = {**(params.get("settings") or {}), "train.seed": seed}
    config = stage_config(stage, params)
    return {**config, "output_dir": str(output_dir), "tracking": {"backend": "none"}}


def train(stage: str, config: dict) -> dict[str, float]:
    from trainer.config import build_config
    from trainer.online.stages import run_online_stage
    from trainer.supervised.stages import run_stage

    built = build_config(stage, config)
    result = run_online_stage(built) if stage in ("ppo", "grpo") else run_stage(built)
    return {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}


def evaluate(candidate: str, baseline: str, prompts: str, arguments: dict[str, Any], output_dir: Path,
             reward_model: str | None) -> dict[str, float]:
    from trainer.config import EvaluateConfig
    from trainer.online.evaluate import run_evaluation

    config = EvaluateConfig.model_validate({
        "output_dir": str(output_dir), "model": {"path": candidate}, "baseline_path": baseline,
        "prompts_path": prompts,
        "reward": {"function": arguments["reward_function"], "model_path": reward_model},
        # Multi-turn episodes in the environment the agent stage trained in, as the evaluate component runs them.
        "environment": {"name": arguments["environment"]} if arguments.get("environment") else None,
        "generation": {"max_new_tokens": arguments["max_new_tokens"], "temperature": 0.0}})
    return run_evaluation(config)


def parameters_key(arguments: dict[str, Any], stage: str) -> str:
    """A short hash of the pipeline parameters a stage reads (names the folder of a cached stage)."""
    values = json.dumps({k: arguments.get(k) for k in STAGE_PARAMETERS[stage]}, sort_keys=True)
    return hashlib.sha1(values.encode()).hexdigest()[:8]


def run_pipeline(pipeline: str, arguments: dict[str, Any], seed: int, root: Path) -> dict[str, Any]:
    """SFT (cached per seed and parameters), the pipeline's stages, then the evaluation against SFT."""
    sft_dir = root / f"sft-{seed}-{parameters_key(arguments, 'sft')}"
    started = time.monotonic()
    if not (sft_dir / "model" / "config.json").is_file():
        train("sft", stage_config_for("sft", arguments, {"train_dataset": arguments["sft_train_uri"],
                                                         "eval_dataset": arguments["sft_eval_uri"]}, seed, sft_dir))
    sft_model = str(sft_dir / "model")
    run_dir = root / f"{pipeline}-{seed}-{time.time_ns()}"
    stage_metrics: dict[str, dict[str, float]] = {}
    reward_model = None
    candidate = sft_model
    for stage in STAGES[pipeline]:
        train_data, eval_data = STAGE_DATA.get(stage, ("preference_train_uri", "preference_eval_uri"))
        artifacts = {"base_model": sft_model, "train_dataset": arguments[train_data],
                     "eval_dataset": arguments[eval_data]}
        if stage == "ppo":
            artifacts["reward_model"] = reward_model
        # The reward model, like SFT, is trained once per seed and parameters.
        output_dir = sft_dir / f"rm-{parameters_key(arguments, 'rm')}" if stage == "rm" else run_dir / stage
        if stage != "rm" or not (output_dir / "model" / "config.json").is_file():
            config = stage_config_for(stage, arguments, artifacts, seed, output_dir)
            stage_metrics[stage] = train(stage, config)
        if stage == "rm":
            reward_model = str(output_dir / "model")
            stage_metrics[stage] = json.loads((output_dir / "final_metrics.json").read_text())
        else:
            candidate = str(output_dir / "model")
    scores = evaluate(candidate, sft_model, arguments["eval_prompts_uri"], arguments, run_dir / "evaluate",
                      reward_model)
    keep = ("eval/accuracy", "eval/rewards/accuracies", "eval/reward_before", "eval/reward", "rewards/accuracies",
            "episode/kl_to_ref")
    return {"pipeline": pipeline, "seed": seed, "seconds": round(time.monotonic() - started, 1),
            **{k: round(v, 4) for k, v in scores.items()},
            "stages": {s: {k: round(v, 4) for k, v in m.items() if k in keep} for s, m in stage_metrics.items()}}


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """`name=value` pairs; the value is JSON when it parses as JSON, else a string."""
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--pipelines", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument("--root", type=Path, default=Path("/tmp/tiny-preset-tuning"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="Override a pipeline parameter of the preset; dict values merge into the preset's.")
    parser.add_argument("--num-threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    from pipelines.presets import preset_arguments

    torch.set_num_threads(args.num_threads)
    logging.basicConfig(level=logging.WARNING)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    overrides = parse_settings(args.set)
    results: dict[str, list[float]] = {}
    for pipeline in args.pipelines:
        arguments = preset_arguments(args.preset, pipeline, args.root)  # its own task files and tiny model
        for name, value in overrides.items():
            is_merge = isinstance(value, dict) and isinstance(arguments.get(name), dict)
            arguments[name] = {**arguments[name], **value} if is_merge else value
        for seed in args.seeds:
            row = run_pipeline(pipeline, arguments, seed, args.root)
            print(json.dumps(row), flush=True)
            results.setdefault(pipeline, []).append(row["improvement"])
    for pipeline, values in results.items():
        print(f"{pipeline}: improvement mean {statistics.mean(values):+.3f} range "
              f"[{min(values):+.3f}, {max(values):+.3f}] over seeds {args.seeds}; "
              f"gate opens on {sum(v > 0 for v in values)}/{len(values)}", flush=True)


if __name__ == "__main__":
    main()
