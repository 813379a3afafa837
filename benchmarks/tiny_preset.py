"""Tune a preset of the tiny demo: run each pipeline's stages in-process over several seeds.

    python benchmarks/tiny_preset.py --pipelines rlhf-dpo --seeds 42 1 2
    python benchmarks/tiny_preset.py --pipelines rlhf-ppo --set ppo_kl_coef=0.1 --set ppo_episodes=80
    python benchmarks/tiny_preset.py --pipelines rlhf-dpo --set 'dpo_settings={"dpo.rpo_alpha": null}'
    python benchmarks/tiny_preset.py --preset tiny-reward-hacking --pipelines rlhf-ppo
    python benchmarks/tiny_preset.py --preset tiny tiny-reward-hacking --pipelines rlhf-ppo --variants native avx2

Each pipeline runs as its stages would run in `alignflow run --preset ...`: the same component
defaults, the same parameter-to-config mapping (`components.stage_io.stage_config`)
and the same evaluation (`trainer.online.evaluate.run_evaluation`: greedy answers of the candidate
and of the SFT baseline on the held-out prompts, scored by the task's checker), but in this
process, without kfp.local, torchrun or MLflow, which makes a run several times faster. Only
`train.seed` changes between seeds (the tiny model's initial weights stay those of the preset).
The SFT and reward models of a seed are trained once per root and parameters and then reused: use
a fresh `--root` after changing the trainer. `benchmarks/tiny_preset.md` is the log of the tuning.

Prints one JSON line per pipeline and seed, then the mean and range of the improvement per pipeline.
Each row also carries the registration gate's decision as the evaluation made it (`gate_opens`; its `gate/*`
numbers under `reported`) and the candidate's paired accuracy comparison with the SFT baseline on the held-out
prompts (`trainer.online.paired_gate.compare_paired` at 95%): wins, losses and `acc_lower_bound`; with a
reward model (rlhf-ppo), whose score the gate judges, `rm_lower_bound` and whether the accuracy guard held
(`guard_holds`).

`--variants` reruns everything under other CPU numerics, each variant in a subprocess with its own environment
and its own `--root` subfolder (VARIANTS: the ISA torch's kernels dispatch to, MKL's and oneDNN's instruction
sets, 1 or 2 threads), and prints a seeds x variants table per preset and pipeline. A preset that is robust to
these is one that behaves the same on a CI runner or a laptop (/work/shared/DESIGN.md: "Other machines'
rounding").
At seed 42 (the pipelines' default `train.seed`) its numbers equal those of `alignflow run`.
Not measured: anything the real pipeline adds (caching, registering the model, tracking).
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
# The confidence of the accuracy bound the tables show: the gate's default (trainer.config.GateConfig).
CONFIDENCE = 0.95
# Numerics variants: the environment of each subprocess and its thread count. `native` dispatches to this CPU's
# best kernels (AVX-512 here); ATEN_CPU_CAPABILITY picks ATen's vectorised kernels, MKL_ENABLE_INSTRUCTIONS MKL's
# (its matmuls) and ONEDNN_MAX_CPU_ISA oneDNN's (v3.12 in torch 2.13; DNNL_MAX_CPU_ISA is its older name).
VARIANTS = {
    "native": ({}, 1),
    "threads2": ({}, 2),
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, 1),
    "default": ({"ATEN_CPU_CAPABILITY": "default"}, 1),
    "sse42": ({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, 1),
}


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
    from components.stage_io import stage_config

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
             reward_model: str | None) -> tuple[dict[str, float], list[list[list[float]]]]:
    """`run_evaluation`'s metrics, and per model (candidate, then baseline) the checkable reward's per-prompt scores
    and, with a reward model, its scores."""
    from trainer.config import EvaluateConfig
    from trainer.online.evaluate import run_evaluation

    config = EvaluateConfig.model_validate({
        "output_dir": str(output_dir), "model": {"path": candidate}, "baseline_path": baseline,
        "prompts_path": prompts,
        "reward": {"function": arguments["reward_function"], "model_path": reward_model},
        # Multi-turn episodes in the environment the agent stage trained in, as the evaluate component runs them.
        "environment": {"name": arguments["environment"]} if arguments.get("environment") else None,
        "generation": {"max_new_tokens": arguments["max_new_tokens"],
                       "temperature": arguments.get("eval_temperature", 0.0)},
        "samples_per_prompt": arguments.get("eval_samples_per_prompt", 1)})
    metrics = run_evaluation(config)
    # Each model's per-prompt scores, as the evaluation wrote them for its own gate.
    records = [json.loads(line) for line in (output_dir / "per_prompt.jsonl").read_text().splitlines() if line]
    names = [name for name in ("reward", "rm_score") if name in records[0]["candidate"]]
    return metrics, [[[r[model][name] for r in records] for name in names] for model in ("candidate", "baseline")]


def gate(metrics: dict[str, float], per_model: list[list[list[float]]]) -> dict[str, Any]:
    """The gate's decision as the evaluation made it (`gate/*` of `metrics`), with the accuracy's paired comparison
    of the candidate (first model) with the baseline (second) that the tables show. With a reward model the
    accuracy is a guard and the reward model's score the judged metric (`rm_lower_bound`)."""
    from trainer.online.paired_gate import compare_paired

    accuracy = compare_paired(per_model[0][0], per_model[1][0], confidence=CONFIDENCE, metric="reward")
    out = {"n": accuracy.n, "acc_wins": accuracy.wins, "acc_losses": accuracy.losses,
           "acc_lower_bound": round(accuracy.lower_bound, 4), "gate_opens": bool(metrics["gate/opens"])}
    if "gate/guard/reward/holds" in metrics:  # a reward model was judged
        out |= {"rm_lower_bound": round(metrics["gate/lower_bound"], 4),
                "guard_holds": bool(metrics["gate/guard/reward/holds"])}
    return out


def parameters_key(arguments: dict[str, Any], stage: str) -> str:
    """A short hash of the pipeline parameters a stage reads (names the folder of a cached stage)."""
    values = json.dumps({k: arguments.get(k) for k in STAGE_PARAMETERS[stage]}, sort_keys=True)
    return hashlib.sha1(values.encode()).hexdigest()[:8]


def stored_stage(root: Path, pipeline: str, seed: int, stage: str, config: dict) -> Path | None:
    """The output folder of a run of `pipeline` at `seed` under `root` whose `stage` was trained with exactly
    `config` (its output folder aside) and saved its model; None when there is none."""
    from trainer.config import build_config

    wanted = {**build_config(stage, config).model_dump(mode="json"), "output_dir": None}
    for params in sorted(root.glob(f"{pipeline}-{seed}-*/{stage}/params.json")):
        saved = {**json.loads(params.read_text()), "output_dir": None}
        if saved == wanted and (params.parent / "model" / "config.json").is_file():
            return params.parent
    return None


def run_pipeline(pipeline: str, arguments: dict[str, Any], seed: int, root: Path,
                 reuse: bool = False) -> dict[str, Any]:
    """SFT (cached per seed and parameters), the pipeline's stages, then the evaluation against SFT. With `reuse`,
    a stage this root already trained with the same config is evaluated again instead of trained again."""
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
            stored = stored_stage(root, pipeline, seed, stage, config) if reuse and stage != "rm" else None
            if stored is not None:
                output_dir = stored
            else:
                stage_metrics[stage] = train(stage, config)
        if stage == "rm":
            reward_model = str(output_dir / "model")
            stage_metrics[stage] = json.loads((output_dir / "final_metrics.json").read_text())
        else:
            candidate = str(output_dir / "model")
    scores, per_model = evaluate(candidate, sft_model, arguments["eval_prompts_uri"], arguments, run_dir / "evaluate",
                                 reward_model)
    # What run_evaluation reports itself (the gate's own keys, where this tree's evaluation has them).
    reported = {k: (bool(v) if k.endswith(("/opens", "/holds")) else round(v, 4)) for k, v in scores.items()
                if k.startswith("gate/")}
    keep = ("eval/accuracy", "eval/rewards/accuracies", "eval/reward_before", "eval/reward", "rewards/accuracies",
            "episode/kl_to_ref")
    return {"pipeline": pipeline, "seed": seed, "seconds": round(time.monotonic() - started, 1),
            **{k: round(v, 4) for k, v in scores.items() if not k.startswith(("gate/", "champion_gate/"))},
            **gate(scores, per_model), **({"reported": reported} if reported else {}),
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


def child_arguments(argv: list[str]) -> list[str]:
    """This command's arguments without `--variants`, `--root` and `--num-threads` (and their values), which
    `run_variants` sets per variant."""
    kept, skipping = [], False
    for token in argv:
        if token.startswith("--"):
            skipping = token.split("=")[0] in ("--variants", "--root", "--num-threads")
        if not skipping:
            kept.append(token)
    return kept


def run_variants(args: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """Rerun this command (without `--variants`) once per variant, each in a subprocess with the variant's
    environment, `--num-threads` and `--root` subfolder; returns every row, tagged with its variant."""
    import os
    import subprocess

    child_argv = child_arguments(argv)
    rows = []
    for variant in args.variants:
        env_updates, threads = VARIANTS[variant]
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **env_updates,
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        command = [sys.executable, __file__, *child_argv, "--root", str(args.root / variant),
                   "--num-threads", str(threads)]
        print(f"# variant {variant}: {' '.join(f'{k}={v}' for k, v in env_updates.items()) or 'native'}, "
              f"{threads} thread(s)", flush=True)
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as child:
            for line in child.stdout:
                if line.startswith("{"):
                    row = {"variant": variant, **json.loads(line)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        if child.returncode:
            print(f"# variant {variant}: exited with {child.returncode}", flush=True)
    return rows


def cell(row: dict[str, Any]) -> str:
    """One table cell: accuracy SFT -> candidate with the gate's lower bound(s), and whether it opens."""
    text = f"{row['baseline_reward']:.2f} -> {row['reward']:.2f} ({row['acc_lower_bound']:+.2f}"
    if "rm_lower_bound" in row:
        text += (f"; rm {row['baseline_rm_score']:.2f} -> {row['rm_score']:.2f} ({row['rm_lower_bound']:+.2f})")
    return text + (") opens" if row["gate_opens"] else ") refused")


def print_tables(rows: list[dict[str, Any]], variants: list[str], seeds: list[int]) -> None:
    """Per preset and pipeline a seeds x variants table (markdown), then how often the gate opened."""
    groups: dict[tuple[str, str], dict[tuple[int, str], dict]] = {}
    for row in rows:
        groups.setdefault((row["preset"], row["pipeline"]), {})[(row["seed"], row["variant"])] = row
    for (preset, pipeline), cells in groups.items():
        n = next(iter(cells.values()))["n"]
        print(f"\n{preset} {pipeline}: held-out accuracy SFT -> candidate (the accuracy's lower bound"
              f"{'; the reward model score and its lower bound' if pipeline == 'rlhf-ppo' else ''}), n = {n}\n")
        print("| seed | " + " | ".join(variants) + " |")
        print("|---|" + "---|" * len(variants))
        for seed in seeds:
            print(f"| {seed} | " + " | ".join(cell(cells[(seed, v)]) if (seed, v) in cells else "-"
                                              for v in variants) + " |")
        done = list(cells.values())
        opened = sum(row["gate_opens"] for row in done)
        gains = [row["improvement"] for row in done]
        summary = (f"gate opens {opened}/{len(done)}; accuracy gain mean {statistics.mean(gains):+.3f} "
                   f"[{min(gains):+.3f}, {max(gains):+.3f}]; accuracy lower bound min "
                   f"{min(row['acc_lower_bound'] for row in done):+.3f} max {max(row['acc_lower_bound'] for row in done):+.3f}")
        if pipeline == "rlhf-ppo":
            summary += (f"; rm lower bound min {min(row['rm_lower_bound'] for row in done):+.3f}; "
                        f"accuracy guard holds {sum(row['guard_holds'] for row in done)}/{len(done)}")
        print("\n" + summary, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["tiny"],
                        help="One or more presets; each runs the given pipelines it has parameters for.")
    parser.add_argument("--pipelines", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument("--root", type=Path, default=Path("/tmp/tiny-preset-tuning"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="Override a pipeline parameter of the preset; dict values merge into the preset's.")
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true",
                        help="Evaluate again the stages this --root already trained with the same config, instead of "
                             "training them again (for a change to the evaluation only).")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        help="Rerun everything under these numerics variants (subprocesses, one after another) and "
                             "print a seeds x variants table per preset and pipeline.")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.variants:
        print_tables(run_variants(args, argv), args.variants, args.seeds)
        return

    import torch
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    from pipelines.presets import PRESETS, preset_arguments

    torch.set_num_threads(args.num_threads)
    logging.basicConfig(level=logging.WARNING)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    overrides = parse_settings(args.set)
    runs = [(preset, pipeline) for preset in args.preset for pipeline in args.pipelines
            if pipeline in PRESETS.get(preset, {pipeline: None})]
    results: dict[tuple[str, str], list[dict]] = {}
    for preset, pipeline in runs:
        arguments = preset_arguments(preset, pipeline, args.root)  # its own task files and tiny model
        for name, value in overrides.items():
            is_merge = isinstance(value, dict) and isinstance(arguments.get(name), dict)
            arguments[name] = {**arguments[name], **value} if is_merge else value
        for seed in args.seeds:
            row = {"preset": preset, **run_pipeline(pipeline, arguments, seed, args.root, args.reuse)}
            print(json.dumps(row), flush=True)
            results.setdefault((preset, pipeline), []).append(row)
    for (preset, pipeline), rows in results.items():
        values = [row["improvement"] for row in rows]
        print(f"{preset} {pipeline}: improvement mean {statistics.mean(values):+.3f} range "
              f"[{min(values):+.3f}, {max(values):+.3f}] over seeds {args.seeds}; gate opens on "
              f"{sum(row['gate_opens'] for row in rows)}/{len(rows)} (accuracy lower bound min "
              f"{min(row['acc_lower_bound'] for row in rows):+.3f})", flush=True)


if __name__ == "__main__":
    main()
