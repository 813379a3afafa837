"""alignflow and TRL side by side on one synthetic workload, stage by stage.

    python benchmarks/side_by_side.py                    # or: make benchmark (about 30 minutes on 2 cores)
    python benchmarks/side_by_side.py --stages grpo --user-defaults --json results.json
    python benchmarks/side_by_side.py --max-steps 16 --compare   # or: make benchmark-check; which stage slowed

The script writes the workload (a 3.2M-parameter Llama, or with `--model large` 96M, with a character tokenizer, SFT rows,
preference pairs, GRPO prompts) into a temporary directory, then trains every stage with alignflow
and with TRL, each run in its own interpreter (this script re-invoked with the hidden `--run-one`)
with 2 intra-op threads in fp32. Runs are interleaved (stage by stage, the two systems in
alternating order) and repeated; the summary prints medians and alignflow/TRL ratios, each the median
of the repeats' own ratios, because on a shared machine absolute figures drift between runs while
ratios of neighbouring runs hold.

What is counted (the same rules for both systems; benchmarks/README.md states them in full):

- step time: from the moment a step's batch is ready to the end of its optimizer step (alignflow's
  `perf/step_time`; a `TrainerCallback` from `on_step_begin` to `on_step_end` in TRL). Imports,
  model loading, tokenisation, reference precomputation, logging and saving are outside it; they
  are in `wall s`, the child's whole run.
- real tokens: tokens the trained model's forward pass sees that are not padding (attention-mask
  ones; every token of a padding-free packed row), summed over the run and divided by the summed
  step time. Reference-model forwards are not counted as tokens (they are work, not throughput).
- samples: SFT rows, preference pairs (RM, DPO), completions (GRPO).
- peak RSS: `ru_maxrss` of the child at its end (imports, model, data, optimizer, everything).
- loss: the mean of the last 8 logged step losses.

Not measured here: PPO (TRL 1.16 has no PPO trainer), evaluation, more than one process.

Regression check (`--compare`, `make benchmark-check`): each stage's alignflow/TRL ratio (completions/s for GRPO,
real tokens/s otherwise) against the last one recorded in benchmarks/recorded.json (`--record` writes a sitting's
ratios there), and which stages slowed by more than `--tolerance`. Ratios, not times: on a shared machine a
sitting's absolute figures drift, its ratios much less. It reports; its exit status does not say slower.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# -- the workload --------------------------------------------------------------------------------
# Llama shapes (`--model`): layers, hidden size, MLP size, heads, KV heads. `small` (3.2M parameters) is the
# workload's; `large` (96M) is `rollout_engines.py`'s, where vLLM's sampling pays off on this CPU.
MODEL_SHAPES = {"small": (4, 256, 768, 4, 2), "large": (8, 1024, 2816, 16, 8)}
SFT_ROWS = 512
SFT_TOKENS = (64, 256)  # total tokens of a row (prompt + completion + EOS), uniform
PROMPT_CHARS = (16, 64)  # one token per character
PREFERENCE_PAIRS = 256
RESPONSE_CHARS = (32, 192)  # chosen and rejected, each drawn on its own
# `dpo_short`: live-reference DPO on the shape of issue 49's outside side-by-side: prompts of about 60 characters,
# answers of 4 to 30 (prompts longer than their answers), the learning rate decaying linearly to 0 in both systems.
SHORT_PROMPT_CHARS = (56, 64)
SHORT_RESPONSE_CHARS = (4, 30)
GRPO_PROMPTS = 64  # addition prompts "a+b=" rewarded by the exact answer (trainer.tiny.task)
# GRPO's shapes, each one pass over the prompts: (prompts a step, generations a prompt, new tokens). `grpo` is
# 2 x 4 completions of 32 tokens, 32 steps; `grpo_8x8` 8 x 8 of 64 tokens, 8 steps. A step's completions are
# one optimizer step (one minibatch) for both systems.
GRPO_SHAPES = {"grpo": (2, 4, 32), "grpo_8x8": (8, 8, 64), "grpo_16x16": (16, 16, 64), "grpo_instructed": (8, 8, 64)}
# `grpo_instructed` is `grpo_8x8` on prompts that open with an instruction, 130 to 132 tokens instead of 4 to 6:
# prompts longer than their answers, as users' are, where rows that share a prompt share its forward.
INSTRUCTION = ("you are a careful calculator. read the sum at the end of this line, work it out, and answer "
               "with the number alone, in digits: ")
GRPO_TARGET_STAGES = ("grpo", "grpo_8x8")  # issue 32's shapes, checked against 1.5x TRL
# `grpo_16x16` (256 completions a step, 4 steps) is where the CPU crossover of `rollout.engine: auto` was measured; it
# runs only when --stages names it.
OPTIONAL_STAGES = ("grpo_16x16",)
MAX_LENGTH = 512  # no row is truncated; TRL's packed SFT fills bins of this many tokens
BATCH_SIZE = 8  # rows (SFT), pairs (RM, DPO) or completions (GRPO) per optimizer step; no accumulation
LR = 1e-4  # constant schedule, no warm-up, AdamW (0.9, 0.999), eps 1e-8, no weight decay, clip 1.0
DPO_BETA = 0.1
NUM_THREADS = 2
SEED = 0
LOSS_TAIL = 8  # steps whose losses are averaged into `loss`

STAGES = ("sft_padded", "sft_packed", "rm", "dpo_live", "dpo_precomputed", "dpo_short", *GRPO_SHAPES)
PREFERENCE_STAGES = ("rm", "dpo_live", "dpo_precomputed", "dpo_short")  # samples are pairs of two sequences
DEFAULT_STAGES = tuple(stage for stage in STAGES if stage not in OPTIONAL_STAGES)
SYSTEMS = ("alignflow", "trl")
RECORDED = Path(__file__).with_name("recorded.json")  # the last recorded ratio of each stage (`--record`, `--compare`)
TOLERANCE = 0.10  # `--compare` calls a stage slower when its ratio fell by more than this share of the recorded one
WORDS = ["the", "model", "learns", "to", "answer", "short", "questions", "about", "numbers", "and", "words",
         "while", "a", "reference", "keeps", "it", "close", "policy", "reward", "token", "sequence", "batch"]


# -- writing the workload ------------------------------------------------------------------------


def _text(rng: random.Random, num_chars: int) -> str:
    """Lowercase words (and the odd digit) of exactly `num_chars` characters."""
    out = ""
    while len(out) < num_chars:
        out += rng.choice(WORDS) + rng.choice([" ", " ", " ", ", ", f" {rng.randint(0, 99)} "])
    return out[:num_chars]


def write_workload(directory: Path, model: str = "small") -> dict[str, Path]:
    """The model directory (of shape `MODEL_SHAPES[model]`) and data files every run reads; identical for both
    systems."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny.model import build_tokenizer
    from trainer.tiny.task import problems, write_jsonl

    tokenizer = build_tokenizer()
    layers, hidden, mlp, heads, kv_heads = MODEL_SHAPES[model]
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=MAX_LENGTH, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(SEED)
    model_dir = directory / "model"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    rng = random.Random(SEED)
    sft = []
    for _ in range(SFT_ROWS):
        total = rng.randint(*SFT_TOKENS)
        prompt_chars = rng.randint(*PROMPT_CHARS)
        # At least one completion character: a row whose prompt takes all its tokens has nothing to train on (and
        # the loader refuses it, naming the line).
        sft.append({"prompt": _text(rng, prompt_chars), "completion": _text(rng, max(1, total - prompt_chars - 1))})
    pairs = [{"prompt": _text(rng, rng.randint(*PROMPT_CHARS)), "chosen": _text(rng, rng.randint(*RESPONSE_CHARS)),
              "rejected": _text(rng, rng.randint(*RESPONSE_CHARS))} for _ in range(PREFERENCE_PAIRS)]
    prompts = [{"prompt": prompt, "answer": answer} for prompt, answer in problems()[:GRPO_PROMPTS]]
    short_rng = random.Random(SEED + 1)  # its own stream: the other files stay as earlier sittings had them
    short = [{"prompt": _text(short_rng, short_rng.randint(*SHORT_PROMPT_CHARS)),
              "chosen": _text(short_rng, short_rng.randint(*SHORT_RESPONSE_CHARS)),
              "rejected": _text(short_rng, short_rng.randint(*SHORT_RESPONSE_CHARS))} for _ in range(PREFERENCE_PAIRS)]
    instructed = [{"prompt": INSTRUCTION + row["prompt"], "answer": row["answer"]} for row in prompts]
    return {"model": model_dir, "sft": write_jsonl(sft, directory / "sft.jsonl"),
            "preference": write_jsonl(pairs, directory / "preference.jsonl"),
            "preference_short": write_jsonl(short, directory / "preference_short.jsonl"),
            "prompts": write_jsonl(prompts, directory / "prompts.jsonl"),
            "grpo_instructed": write_jsonl(instructed, directory / "instructed_prompts.jsonl")}


def grpo_prompts(stage: str, files: dict[str, Path]) -> Path:
    """The prompts file a GRPO stage samples from."""
    return files["grpo_instructed" if stage == "grpo_instructed" else "prompts"]


def training_file(stage: str, files: dict[str, Path]) -> Path:
    """The data file a supervised or preference stage trains on."""
    if stage.startswith("sft"):
        return files["sft"]
    return files["preference_short" if stage == "dpo_short" else "preference"]


def scheduler(stage: str) -> str:
    """The learning-rate schedule of a stage's runs (both systems): constant, but linear decay for `dpo_short`."""
    return "linear" if stage == "dpo_short" else "constant"


# -- child: alignflow ------------------------------------------------------------------------------


def alignflow_config(stage: str, files: dict[str, Path], output_dir: Path,
                     max_steps: int | None = None) -> tuple[str, dict]:
    """(alignflow stage, raw config) of one measured run; `max_steps` cuts the epoch short."""
    common = {
        "output_dir": str(output_dir),
        "model": {"path": str(files["model"])},
        "optimizer": {"lr": LR, "scheduler": scheduler(stage), "weight_decay": 0.0, "max_grad_norm": 1.0},
        "checkpoint": {"keep_last": 1, "save_interval": 0},
        "tracking": {"backend": "none"},
    }
    train = {"micro_batch_size": BATCH_SIZE, "seed": SEED, "log_interval": 1, "mixed_precision": "no",
             "num_threads": NUM_THREADS}
    if stage in GRPO_SHAPES:
        prompts, generations, new_tokens = GRPO_SHAPES[stage]
        episodes = min(GRPO_PROMPTS // prompts, max_steps or GRPO_PROMPTS)
        completions = prompts * generations
        return "grpo", {**common, "data": {"train_path": str(grpo_prompts(stage, files))},
                        "train": {**train, "micro_batch_size": completions},
                        "generation": {"max_new_tokens": new_tokens, "temperature": 1.0},
                        "reward": {"function": "tiny_addition"},
                        "grpo": {"num_episodes": episodes, "rollout_batch_size": prompts, "num_generations": generations,
                                 "mini_batch_size": completions, "beta": 0.0}}
    data = {"train_path": str(training_file(stage, files)), "max_length": MAX_LENGTH}
    config = {**common, "data": data, "train": {**train, "max_epochs": 1, "max_steps": max_steps}}
    if stage.startswith("sft"):
        return "sft", {**config, "sft": {"packing": stage == "sft_packed"}}
    if stage == "rm":
        return "rm", config
    return "dpo", {**config, "dpo": {"beta": DPO_BETA, "precompute_ref_log_probs": stage == "dpo_precomputed"}}


def run_alignflow(stage: str, files: dict[str, Path], output_dir: Path, max_steps: int | None,
                  overrides: list[str] = ()) -> dict:
    """Train one stage through alignflow's own entry points; read the figures back from metrics.jsonl."""
    from trainer.config import build_config

    kind, raw = alignflow_config(stage, files, output_dir, max_steps)
    for override in overrides:  # --set section.key=value, for ablations (e.g. train.group_by_length=false)
        key, _, value = override.partition("=")
        *sections, leaf = key.split(".")
        target = raw
        for section in sections:
            target = target.setdefault(section, {})
        target[leaf] = json.loads(value)
    config = build_config(kind, raw)
    if kind == "grpo":
        from trainer.online.stages import run_online_stage

        run_online_stage(config)
    else:
        from trainer.supervised.stages import run_stage

        run_stage(config)
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    if kind == "grpo":  # an episode is one GRPO step (rollout, scoring, the update), timed by the loop itself
        episodes = [row for row in rows if "perf/time/step" in row]
        seconds = sum(row["perf/time/step"] for row in episodes)
        breakdown = {key.removeprefix("perf/time/"): sum(row[key] for row in episodes) / seconds
                     for key in episodes[0] if key.startswith("perf/time/") and key != "perf/time/step"}
        return {"seconds": seconds, "steps": len(episodes),
                "samples": sum(row["perf/completions_per_second"] * row["perf/time/step"] for row in episodes),
                "tokens": sum(row["perf/tokens_per_second"] * row["perf/time/step"] for row in episodes),
                "losses": losses, "time_shares": breakdown}
    steps = [row for row in rows if "perf/step_time" in row]
    return {"seconds": sum(row["perf/step_time"] for row in steps), "steps": len(steps),
            "samples": sum(row["perf/samples_per_second"] * row["perf/step_time"] for row in steps),
            "tokens": sum(row["perf/tokens_per_second"] * row["perf/step_time"] for row in steps), "losses": losses}


# -- child: TRL ----------------------------------------------------------------------------------


class ForwardCounter:
    """Counts the real tokens and the rows (or packed samples) the trained model's forward passes see."""

    def __init__(self) -> None:
        self.tokens = 0
        self.samples = 0

    def __call__(self, module, args, kwargs) -> None:
        if not module.training:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        self.tokens += int(mask.sum()) if mask is not None else input_ids.numel()
        # A padding-free packed row holds one sample per position id 0.
        self.samples += int((positions == 0).sum()) if mask is None and positions is not None else input_ids.shape[0]


def run_trl(stage: str, files: dict[str, Path], output_dir: Path, max_steps: int | None) -> dict:
    """Train one stage with TRL's trainer for it, configured as alignflow is (fp32, same optimiser and schedule)."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    datasets.disable_progress_bars()
    tokenizer = AutoTokenizer.from_pretrained(files["model"])
    common = dict(output_dir=str(output_dir), per_device_train_batch_size=BATCH_SIZE, num_train_epochs=1,
                  learning_rate=LR, lr_scheduler_type=scheduler(stage), warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                  logging_steps=1, save_strategy="no", report_to="none", bf16=False, fp16=False,
                  gradient_checkpointing=False, use_cpu=True, seed=SEED, data_seed=SEED, dataloader_num_workers=0,
                  disable_tqdm=True, max_steps=max_steps or -1)
    counter = ForwardCounter()
    step_seconds: list[float] = []
    step_tokens: list[int] = []
    step_samples: list[int] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            counter.tokens = counter.samples = 0
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(time.perf_counter() - self.started)
            step_tokens.append(counter.tokens)
            step_samples.append(counter.samples)

    if stage == "rm":
        model = AutoModelForSequenceClassification.from_pretrained(files["model"], num_labels=1)
    else:
        model = AutoModelForCausalLM.from_pretrained(files["model"])
    model.register_forward_pre_hook(counter, with_kwargs=True)
    if stage.startswith("sft"):
        # TRL packs into bins of max_length tokens, 8 bins a step; bins of the longest row (256) keep its steps
        # near alignflow's 8 rows without truncating any row.
        packed = stage == "sft_packed"
        args = trl.SFTConfig(**common, max_length=SFT_TOKENS[1] if packed else MAX_LENGTH, packing=packed)
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=_dataset(files["sft"]),
                                 processing_class=tokenizer, callbacks=[StepTimer()])
    elif stage == "rm":
        args = trl.RewardConfig(**common, max_length=MAX_LENGTH)
        trainer = trl.RewardTrainer(model=model, args=args, train_dataset=_dataset(files["preference"]),
                                    processing_class=tokenizer, callbacks=[StepTimer()])
    elif stage.startswith("dpo"):
        args = trl.DPOConfig(**common, max_length=MAX_LENGTH, beta=DPO_BETA,
                             precompute_ref_log_probs=stage == "dpo_precomputed")
        trainer = trl.DPOTrainer(model=model, args=args, train_dataset=_dataset(training_file(stage, files)),
                                 processing_class=tokenizer, callbacks=[StepTimer()])
    else:
        from trainer.tiny.task import check_answer

        def addition(prompts, completions, answer, **_):  # TRL's batched reward-function form
            return [check_answer(completion, expected) for completion, expected in zip(completions, answer)]

        prompts, generations, new_tokens = GRPO_SHAPES[stage]
        args = trl.GRPOConfig(**{**common, "per_device_train_batch_size": prompts * generations},
                              num_generations=generations, max_completion_length=new_tokens, temperature=1.0, beta=0.0)
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[addition], args=args,
                                  train_dataset=_dataset(grpo_prompts(stage, files)), processing_class=tokenizer,
                                  callbacks=[StepTimer()])
    trainer.train()
    history = trainer.state.log_history
    losses = [row["loss"] for row in history if "loss" in row]
    if stage in GRPO_SHAPES:
        lengths = [row["completions/mean_length"] for row in history if "completions/mean_length" in row]
        completions = args.per_device_train_batch_size * len(step_seconds)
        return {"seconds": sum(step_seconds), "steps": len(step_seconds), "samples": completions,
                "tokens": completions * statistics.fmean(lengths), "losses": losses}
    pairs = 2 if stage in PREFERENCE_STAGES else 1  # chosen and rejected rows of a pair
    return {"seconds": sum(step_seconds), "steps": len(step_seconds), "samples": sum(step_samples) / pairs,
            "tokens": sum(step_tokens), "losses": losses}


def _dataset(path: Path):
    import datasets

    return datasets.load_dataset("json", data_files=str(path), split="train")


def run_one(spec_path: Path) -> None:
    """Child: train one (system, stage) and write its figures, peak RSS included, to the spec's result file."""
    import torch

    _quiet_libraries()
    spec = json.loads(spec_path.read_text())
    if not spec.get("user_defaults"):
        torch.set_num_threads(NUM_THREADS)
    files = {key: Path(value) for key, value in spec["files"].items()}
    if spec["system"] == "alignflow":
        result = run_alignflow(spec["stage"], files, Path(spec["output_dir"]), spec["max_steps"],
                               spec.get("overrides", []))
    else:
        result = run_trl(spec["stage"], files, Path(spec["output_dir"]), spec["max_steps"])
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result["torch_threads"] = torch.get_num_threads()
    Path(spec["result"]).write_text(json.dumps(result))


def require_trl(systems: list[str]) -> None:
    """Exit with one line when `systems` names TRL and it is not installed."""
    if "trl" in systems:
        try:
            import trl  # noqa: F401
        except ImportError:
            sys.exit("benchmark: TRL is not installed; `make benchmark` installs the `bench` extra")


def _quiet_libraries() -> None:
    import warnings

    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    warnings.filterwarnings("ignore")


# -- parent: interleave, repeat, summarise ---------------------------------------------------------


def launch(system: str, stage: str, files: dict[str, Path], work_dir: Path, run_index: int,
           max_steps: int | None, overrides: list[str] = (), user_defaults: bool = False,
           interpreter: str = sys.executable) -> dict:
    """One measured run in a fresh `interpreter` with 2 threads; returns its figures and its wall time."""
    name = f"{run_index:03d}-{system}-{stage}"
    spec = {"system": system, "stage": stage, "files": {k: str(v) for k, v in files.items()},
            "output_dir": str(work_dir / "runs" / name), "result": str(work_dir / f"{name}.result.json"),
            "max_steps": max_steps, "user_defaults": user_defaults,
            # A user's defaults: alignflow's threads and MLflow tracking (TRL's `report_to` defaults to none).
            "overrides": [*overrides, *(["train.num_threads=null", 'tracking.backend="mlflow"'] * user_defaults)]}
    spec_path = work_dir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    threads = str(NUM_THREADS)
    # PASSIVE: a waiting OpenMP thread sleeps instead of spinning (2 spinning threads ran 10x slower on busy cores).
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_DISABLED": "true"}
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY") if user_defaults else ():
        env.pop(variable)  # each system's own thread count and OpenMP's default (spinning) wait, as a user runs them
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work_dir / 'mlflow.db'}")  # where user-default tracking logs
    started = time.perf_counter()
    completed = subprocess.run([interpreter, str(Path(__file__).resolve()), "--run-one", str(spec_path)],
                               env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if completed.returncode != 0:
        sys.exit(f"benchmark: {system} {stage} failed with exit status {completed.returncode}:\n"
                 + completed.stdout[-4000:])
    result = json.loads(Path(spec["result"]).read_text())
    result["wall_seconds"] = time.perf_counter() - started
    return result


def figures(result: dict) -> dict[str, float]:
    """Throughput and the other columns of one run."""
    return {"tokens_per_second": result["tokens"] / result["seconds"],
            "samples_per_second": result["samples"] / result["seconds"], "peak_rss_mb": result["peak_rss_mb"],
            "loss": statistics.fmean(result["losses"][-LOSS_TAIL:]), "wall_seconds": result["wall_seconds"],
            "steps": result["steps"], "tokens": result["tokens"]}


def medians(runs: list[dict]) -> dict[str, float]:
    keys = runs[0].keys()
    return {key: statistics.median(run[key] for run in runs) for key in keys}


def paired_ratio(mine: list[dict], theirs: list[dict], key: str, their_key: str | None = None) -> float:
    """The median over repeats of mine[i][key] / theirs[i][their_key]: run i of each system ran back to back,
    on the same machine load, whereas runs of one system drift between repeats (by 2x on a shared machine)."""
    return statistics.median(m[key] / t[their_key or key] for m, t in zip(mine, theirs, strict=True))


def summarise(results: dict[tuple[str, str], list[dict]], stages: list[str]) -> list[dict]:
    """Per stage: medians of each system, and the alignflow/TRL ratios (medians of the repeats' own ratios)."""
    rows = []
    for stage in stages:
        mine, theirs = results[("alignflow", stage)], results[("trl", stage)]
        rows.append({"stage": stage, "alignflow": medians(mine), "trl": medians(theirs),
                     "tokens_ratio": paired_ratio(mine, theirs, "tokens_per_second"),
                     "samples_ratio": paired_ratio(mine, theirs, "samples_per_second"),
                     "rss_ratio": paired_ratio(mine, theirs, "peak_rss_mb")})
    return rows


def format_table(rows: list[dict]) -> str:
    header = ["stage", "af tok/s", "trl tok/s", "tok x", "af smp/s", "trl smp/s", "smp x", "af RSS MB",
              "trl RSS MB", "RSS x", "af loss", "trl loss", "af steps", "trl steps", "af wall s", "trl wall s"]
    cells = [header]
    for row in rows:
        a, t = row["alignflow"], row["trl"]
        cells.append([row["stage"], f"{a['tokens_per_second']:.0f}", f"{t['tokens_per_second']:.0f}",
                      f"{row['tokens_ratio']:.2f}", f"{a['samples_per_second']:.1f}", f"{t['samples_per_second']:.1f}",
                      f"{row['samples_ratio']:.2f}", f"{a['peak_rss_mb']:.0f}", f"{t['peak_rss_mb']:.0f}",
                      f"{row['rss_ratio']:.2f}", f"{a['loss']:.4f}", f"{t['loss']:.4f}", f"{a['steps']:.0f}",
                      f"{t['steps']:.0f}", f"{a['wall_seconds']:.1f}", f"{t['wall_seconds']:.1f}"])
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    return "\n".join([lines[0], "  ".join("-" * width for width in widths), *lines[1:]])


def check_targets(rows: list[dict], results: dict[tuple[str, str], list[dict]]) -> list[str]:
    """The issue's targets, each with the measured figure (a median of per-repeat ratios) and met/missed."""
    by_stage = {row["stage"]: row for row in rows}
    checks = []

    def check(label: str, value: float, target: float, at_most: bool = False) -> None:
        met = value <= target if at_most else value >= target
        checks.append(f"{'met   ' if met else 'MISSED'} {label}: {value:.2f} ({'<=' if at_most else '>='} {target})")

    for stage in ("sft_padded", "sft_packed", "rm", "dpo_live"):
        if stage in by_stage:
            check(f"{stage} real tokens/s vs TRL", by_stage[stage]["tokens_ratio"], 1.5)
    if "dpo_short" in by_stage:  # issue 49: the lead an outside side-by-side saw shrink from 1.41x
        check("dpo_short real tokens/s vs TRL", by_stage["dpo_short"]["tokens_ratio"], 1.4)
    if "dpo_precomputed" in by_stage and "dpo_live" in by_stage:
        ratio = paired_ratio(results[("alignflow", "dpo_precomputed")], results[("trl", "dpo_live")],
                             "tokens_per_second")
        check("dpo precomputed reference vs TRL's live-reference DPO, tokens/s", ratio, 2.0)
    for stage in GRPO_TARGET_STAGES:
        if stage in by_stage:
            check(f"{stage} completions/s vs TRL", by_stage[stage]["samples_ratio"], 1.5)
    for row in rows:
        check(f"{row['stage']} peak RSS vs TRL", row["rss_ratio"], 0.8, at_most=True)
    if "sft_padded" in by_stage and "sft_packed" in by_stage:
        ratio = paired_ratio(results[("alignflow", "sft_packed")], results[("alignflow", "sft_padded")],
                             "tokens_per_second")
        check("alignflow packed SFT vs its padded SFT, tokens/s", ratio, 1.0)
    return checks


def headline(stage: str) -> str:
    """The ratio a stage is judged by: completions/s for GRPO (what its targets count), real tokens/s otherwise."""
    return "samples_ratio" if stage in GRPO_SHAPES else "tokens_ratio"


def _repeat_ratios(results: dict[tuple[str, str], list[dict]], stage: str) -> list[float]:
    key = headline(stage).replace("_ratio", "_per_second")
    return [m[key] / t[key] for m, t in zip(results[("alignflow", stage)], results[("trl", stage)], strict=True)]


def record(rows: list[dict], results: dict[tuple[str, str], list[dict]], path: Path, note: str) -> None:
    """Write this sitting's ratio of every stage it ran into `path`, keeping the other stages' older records."""
    recorded = json.loads(path.read_text()) if path.exists() else {}
    when = datetime.date.today().isoformat()
    for row in rows:
        stage = row["stage"]
        recorded[stage] = {"ratio": round(row[headline(stage)], 3), "of": headline(stage).removesuffix("_ratio"),
                           "repeats": [round(r, 3) for r in _repeat_ratios(results, stage)], "date": when,
                           "commit": _commit(), "note": note}
    path.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")


def _commit() -> str:
    completed = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, check=False,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=Path(__file__).parent,
                           check=False, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    return (completed.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def compare(rows: list[dict], recorded: dict[str, dict], tolerance: float = TOLERANCE) -> list[str]:
    """Each stage's ratio now against its last recorded one; the lines name the stages that slowed."""
    lines, slowed = [], []
    for row in rows:
        stage, now = row["stage"], row[headline(row["stage"])]
        last = recorded.get(stage)
        if last is None:
            lines.append(f"{stage:>16}: {now:.2f}x now, nothing recorded (--record keeps this sitting's)")
            continue
        change = now / last["ratio"] - 1
        verdict = "SLOWER" if change < -tolerance else "faster" if change > tolerance else "same"
        if verdict == "SLOWER":
            slowed.append(stage)
        lines.append(f"{stage:>16}: {now:.2f}x now, {last['ratio']:.2f}x recorded ({last['date']}, "
                     f"{last['commit']}): {change:+.0%}  {verdict}")
    lines.append(f"slowed by more than {tolerance:.0%} against the record: {', '.join(slowed) if slowed else 'none'}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help=f"Comma-separated subset of {','.join(STAGES)}.")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="alignflow,trl or one of them.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each (system, stage); medians are reported.")
    parser.add_argument("--max-steps", type=int, help="Cut every run to this many optimizer steps (GRPO: episodes); "
                        "default: one epoch of the workload.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="Override an alignflow config key in every alignflow run, e.g. train.group_by_length=false.")
    parser.add_argument("--user-defaults", action="store_true", help="Each system as a user runs it: its own thread "
                        "count, OpenMP's default (spinning) wait, alignflow's MLflow tracking on (TRL reports nowhere).")
    parser.add_argument("--model", choices=list(MODEL_SHAPES), default="small",
                        help="The Llama every stage trains: small (4 x 256, 3.2M) or large (8 x 1024, 96M).")
    parser.add_argument("--alignflow-python", default=sys.executable,
                        help="The interpreter of alignflow's runs: e.g. .venv-vllm/bin/python (make test-vllm's "
                        "environment) with --set 'rollout.engine=\"vllm\"', TRL's runs staying in this one.")
    parser.add_argument("--json", type=Path, help="Also write every run's figures and the summary here.")
    parser.add_argument("--compare", action="store_true", help="Compare each stage's alignflow/TRL ratio with the "
                        "last one recorded (--recorded) and say which stages slowed by more than --tolerance; "
                        "it reports, it does not fail.")
    parser.add_argument("--record", action="store_true", help="Write this sitting's ratios to --recorded (after "
                        "--compare, if given), keeping the other stages' records.")
    parser.add_argument("--recorded", type=Path, default=RECORDED, help="The recorded ratios' file.")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="--compare: a fall of more than this share of the recorded ratio is a slowdown.")
    parser.add_argument("--note", default="", help="--record: what the sitting was (machine, load), kept beside it.")
    parser.add_argument("--keep", type=Path, help="Write the workload and runs here and keep them.")
    parser.add_argument("--run-one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.stages or set(args.stages) - set(STAGES):
        parser.error(f"--stages {args.stages}: expected a subset of {','.join(STAGES)}")
    if not args.systems or set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems {args.systems}: expected a subset of {','.join(SYSTEMS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if (args.compare or args.record) and len(args.systems) != 2:
        parser.error("--compare and --record need both systems: they read alignflow/TRL ratios")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_one is not None:
        run_one(args.run_one)
        return
    require_trl(args.systems)
    _quiet_libraries()
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            work_dir = args.keep
            work_dir.mkdir(parents=True, exist_ok=True)
        else:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="alignflow-side-by-side-")))
        files = write_workload(work_dir / "workload", args.model)
        results: dict[tuple[str, str], list[dict]] = {(s, t): [] for s in args.systems for t in args.stages}
        run_index = 0
        for repeat in range(args.repeats):
            for stage in args.stages:
                # Alternate which system goes first, so neither always runs on a machine the other just warmed.
                order = args.systems if (repeat + STAGES.index(stage)) % 2 == 0 else args.systems[::-1]
                for system in order:
                    run_index += 1
                    raw = launch(system, stage, files, work_dir, run_index, args.max_steps, args.set,
                                 args.user_defaults,
                                 args.alignflow_python if system == "alignflow" else sys.executable)
                    result = figures(raw)
                    results[(system, stage)].append(result)
                    shares = "  ".join(f"{phase} {share:.0%}" for phase, share in raw.get("time_shares", {}).items()
                                       if share >= 0.005)  # alignflow's online steps: where the time went
                    print(f"[{repeat + 1}/{args.repeats}] {stage:>15} {system:>9}: "
                          f"{result['tokens_per_second']:8.0f} tok/s  {result['samples_per_second']:7.1f} samples/s  "
                          f"{result['peak_rss_mb']:5.0f} MB  loss {result['loss']:.4f}  "
                          f"({result['wall_seconds']:.0f} s){'  ' + shares if shares else ''}", flush=True)
    layers, hidden, mlp, _, _ = MODEL_SHAPES[args.model]
    print(f"\nmodel: Llama {layers}x{hidden} (MLP {mlp}), char tokenizer; batch {BATCH_SIZE}; "
          f"fp32; {NUM_THREADS} threads; steps {args.max_steps or 'one epoch'}; medians of {args.repeats}; "
          "x = alignflow / TRL, the median of each repeat's own ratio")
    summary = []
    if len(args.systems) == 2:
        summary = summarise(results, args.stages)
        print(format_table(summary))
        print("\n".join(check_targets(summary, results)))
        if args.compare:
            recorded = json.loads(args.recorded.read_text()) if args.recorded.exists() else {}
            print(f"\nagainst the last recorded ratios ({args.recorded.name}):")
            print("\n".join(compare(summary, recorded, args.tolerance)))
        if args.record:
            record(summary, results, args.recorded, args.note)
            print(f"recorded: {', '.join(args.stages)} in {args.recorded}")
    if args.json is not None:
        runs = [{"system": s, "stage": t, "runs": v} for (s, t), v in results.items()]
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
