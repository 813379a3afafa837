"""Rollout engines side by side: completions/s and generated tokens/s of `hf` and `vllm` on one sampling workload.

    .venv-vllm/bin/python benchmarks/rollout_engines.py                     # both models, both engines, 2 repeats
    .venv-vllm/bin/python benchmarks/rollout_engines.py --models small --prompts 64 --json out.json

Runs in the environment of `make test-vllm` (vLLM's CPU build beside the same torch). Each model is a
random-initialised Llama written with `save_pretrained` (the character tokenizer of
`trainer.tiny.model`, 101 tokens): `small` is `side_by_side.py`'s 3.2M-parameter model (4 layers x 256),
`large` is 8 layers x 1024 (MLP 2816, 16 heads, 8 KV heads: 96M parameters). Each measured run is its own
interpreter (this script re-invoked with `--run-one`) that builds the engine the way the online stages do
(`build_rollout_engine`, fp32, `rollout.num_threads` as configured), samples one warm-up batch, then
`--batches` batches of `--prompts` addition prompts x `--samples` samples x up to `--new-tokens` tokens
(temperature 1, EOS the only stop), and pushes the weights once (`sync_from`, what an episode does).
Engines alternate within each repeat; the summary gives medians and, per repeat, vllm/hf ratios.

Counted: completions/s and generated tokens/s (response tokens up to and including the stop token, over
the sampling calls' wall time); start (building the engine: vLLM's start, nothing for `hf`); sync (one
weight push); peak RSS (`ru_maxrss` of the child: imports, model, engine, KV cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {"small": {"hidden_size": 256, "num_layers": 4, "intermediate_size": 768, "num_heads": 4, "num_kv_heads": 2},
          "large": {"hidden_size": 1024, "num_layers": 8, "intermediate_size": 2816, "num_heads": 16,
                    "num_kv_heads": 8}}
ENGINES = ("hf", "vllm")


def write_model(name: str, directory: Path, vocab_size: int | None = None) -> Path:
    """A random Llama of shape `MODELS[name]` with the tiny character tokenizer, as an HF directory; with
    `vocab_size`, its embedding and head have that many rows (ids past the tokenizer's are never decoded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny.model import build_tokenizer

    shape = MODELS[name]
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                         num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                         max_position_embeddings=512, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory / name)
    tokenizer.save_pretrained(directory / name)
    return directory / name


def run_one(spec: dict) -> dict:
    """One engine on one model in this interpreter; returns its figures."""
    import torch

    from trainer.config import GenerationConfig, ModelConfig, RolloutConfig
    from trainer.data.tokenize import encode_prompt
    from trainer.modeling.models import load_causal_lm, load_tokenizer
    from trainer.rollout.engine_registry import build_rollout_engine
    from trainer.rollout.engines import EngineSetup
    from trainer.rollout.single_turn import sample

    torch.set_num_threads(spec["threads"])
    model_dir = spec["model"]
    policy = load_causal_lm(ModelConfig(path=model_dir)).eval()
    tokenizer = load_tokenizer(model_dir)
    rollout = RolloutConfig(engine=spec["engine"], num_threads=spec["rollout_threads"])
    started = time.perf_counter()
    engine = build_rollout_engine(rollout, policy, EngineSetup(model_dir))
    start_seconds = time.perf_counter() - started
    options = GenerationConfig(max_new_tokens=spec["new_tokens"], temperature=1.0)
    prompts = [encode_prompt(tokenizer, f"{a}+{a * 7 % 50}=") for a in range(spec["prompts"])]
    rows = [prompt for prompt in prompts for _ in range(spec["samples"])]
    torch.manual_seed(0)
    sample(engine, tokenizer, rows[:8], options, torch.device("cpu"))  # warm-up (first-call costs)
    seconds = tokens = completions = 0.0
    for _ in range(spec["batches"]):
        started = time.perf_counter()
        batch, _ = sample(engine, tokenizer, rows, options, torch.device("cpu"))
        seconds += time.perf_counter() - started
        tokens += float(batch["action_mask"].sum())
        completions += len(rows)
    started = time.perf_counter()
    engine.sync_from(policy)
    sync_seconds = time.perf_counter() - started
    engine.close()
    return {"completions_per_second": completions / seconds, "tokens_per_second": tokens / seconds,
            "mean_length": tokens / completions, "start_seconds": start_seconds, "sync_seconds": sync_seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch.get_num_threads()}


def run_child(script: str, spec: dict, name: str, work_dir: Path) -> dict:
    """`script --run-one` on `spec` in a fresh interpreter (its own imports, allocator and peak RSS), with
    `spec["threads"]` passive OpenMP threads; returns the figures it wrote. `name` labels its files and errors."""
    spec_path = work_dir / f"{name}.json"
    result_path = spec_path.with_suffix(".result.json")
    spec_path.write_text(json.dumps({**spec, "result": str(result_path)}))
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, str(Path(script).resolve()), "--run-one", str(spec_path)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{Path(script).stem}: {name} failed:\n{done.stdout[-4000:]}")
    return json.loads(result_path.read_text())


def measure(spec: dict, work_dir: Path) -> dict:
    """`run_one` in a fresh interpreter."""
    return run_child(__file__, spec, f"{spec['model_name']}-{spec['engine']}-{spec['repeat']}", work_dir)


def summarise(results: list[dict]) -> str:
    """Medians per (model, engine) and the per-repeat vllm/hf ratios of completions/s."""
    lines = [f"{'model':>6}  {'engine':>6}  {'compl/s':>8}  {'tok/s':>8}  {'len':>5}  {'start s':>7}  {'sync s':>6}  "
             f"{'RSS MB':>7}  vllm/hf compl/s per repeat"]
    for model in dict.fromkeys(r["model_name"] for r in results):
        for engine in ENGINES:
            rows = [r for r in results if r["model_name"] == model and r["engine"] == engine]
            if not rows:
                continue
            median = {key: statistics.median(r[key] for r in rows) for key in rows[0] if isinstance(rows[0][key], float)}
            ratios = ""
            if engine == "vllm":
                hf = {r["repeat"]: r for r in results if r["model_name"] == model and r["engine"] == "hf"}
                ratios = ", ".join(f"{r['completions_per_second'] / hf[r['repeat']]['completions_per_second']:.2f}"
                                   for r in rows if r["repeat"] in hf)
            lines.append(f"{model:>6}  {engine:>6}  {median['completions_per_second']:8.1f}  "
                         f"{median['tokens_per_second']:8.0f}  {median['mean_length']:5.1f}  "
                         f"{median['start_seconds']:7.1f}  {median['sync_seconds']:6.2f}  {median['peak_rss_mb']:7.0f}  "
                         f"{ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small,large", help="comma-separated: small, large")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per batch")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (GRPO's group)")
    parser.add_argument("--new-tokens", type=int, default=32, help="longest response")
    parser.add_argument("--batches", type=int, default=2, help="measured batches per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads of each child")
    parser.add_argument("--rollout-threads", type=int, default=None,
                        help="rollout.num_threads (default: null, the child's threads, for both engines)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="rows of the models' embedding and head (default: the character tokenizer's 101)")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
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
            model_dir = write_model(model_name, work_dir, args.vocab_size)
            engines = tuple(args.engines.split(","))
            for repeat in range(args.repeats):
                order = engines if repeat % 2 == 0 else engines[::-1]  # alternate who goes first
                for engine in order:
                    spec = {"model": str(model_dir), "model_name": model_name, "engine": engine, "repeat": repeat,
                            "prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens,
                            "batches": args.batches, "threads": args.threads, "rollout_threads": args.rollout_threads}
                    result = {**spec, **measure(spec, work_dir)}
                    print(json.dumps(result), file=sys.stderr)
                    results.append(result)
    print(summarise(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
