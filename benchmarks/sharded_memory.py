"""Peak memory per rank under FSDP2 for a model that does not fit a per-rank budget unsharded.

    .venv/bin/python benchmarks/sharded_memory.py                 # 4 gloo ranks, ~106 M-parameter Llama
    .venv/bin/python benchmarks/sharded_memory.py --ranks 2 --hidden 512 --layers 4 --json out.json

The script writes a random Llama-shaped model (`save_pretrained`, bf16 safetensors) to a temporary
directory, then runs two torchrun jobs of `--ranks` CPU processes (gloo), each rank measuring its
own resident memory (a sampling thread reads /proc/self/statm every millisecond, so a peak is the
highest RSS seen inside one phase):

- `plain`: every rank loads the whole model (`load_causal_lm`) and FSDP2 then shards it
  (`Booster.boost`), which is what alignflow did before sharded loading;
- `sharded`: every rank builds the model on the meta device and reads only its slices
  (`load_causal_lm(..., plugin=FSDP2Plugin)`), takes one AdamW step, writes a sharded checkpoint
  (`CheckpointManager.save`, DCP), gathers the full model and optimizer state the way the
  full-state checkpoint path does (for contrast: rank 0 holds all of it), and resumes from the
  sharded checkpoint into a freshly sharded model.

Memory is anonymous resident memory (`RssAnon`), so file pages mapped from the safetensors files
(shared page cache) are not counted. It prints one row per phase: each rank's peak in MiB and, in
brackets, how far it rose above where the phase started. The baseline (imports, process group, no
model) is printed once. The budget is the stated per-rank memory for weights that an unsharded
fp32 copy exceeds.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    """Anonymous resident memory (`RssAnon`): what the process itself holds. File pages mapped from the
    safetensors files (shared page cache, evictable) are left out, so `mmap`ed loads are not undercounted
    as private nor counted once per rank."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakRSS:
    """Highest RSS (MiB) seen while the block runs, sampled every millisecond by a thread."""

    def __enter__(self) -> PeakRSS:
        self.peak = rss_mib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, rss_mib())

    def __exit__(self, *_exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


# ---- the model ------------------------------------------------------------------------------


def write_model(directory: Path, hidden: int, layers: int, vocab: int) -> int:
    """A random Llama of the given shape, saved in bf16 as published checkpoints are (training loads it
    in fp32, so every rank converts what it reads); its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny.model import build_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, vocab_size=vocab,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


# ---- one rank -------------------------------------------------------------------------------


def run_rank(mode: str, model_dir: str, work_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from trainer.checkpointing.checkpoint import CheckpointManager
    from trainer.config import ModelConfig
    from trainer.modeling.models import load_causal_lm
    from trainer.parallel.booster import Booster, FSDP2Plugin
    from trainer.runtime import init_process_group, pick_device, read_distributed_env

    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    torch.set_num_threads(1)
    plugin = FSDP2Plugin(env, device)
    booster = Booster(plugin, "no")
    config = ModelConfig(path=model_dir)
    warm_up_imports()  # the baseline then holds every module the phases import, and no model
    gc.collect()
    figures = {"baseline": rss_mib()}

    def measure(name: str, work) -> object:
        dist.barrier()
        release_free_memory()
        start = rss_mib()
        with PeakRSS() as peak:
            result = work()
            dist.barrier()
        figures[name] = {"start": start, "peak": peak.peak}
        return result

    if mode == "plain":
        measure("load", lambda: booster.boost(load_causal_lm(config))[0])
    else:
        model = measure("load", lambda: load_causal_lm(config, plugin=plugin))
        optimizer, scheduler = step_once(model, booster)
        manager = CheckpointManager(Path(work_dir) / "checkpoints", booster)
        components = {"model": (model, optimizer, scheduler)}
        directory = measure("save (sharded, DCP)", lambda: manager.save(components, {"global_step": 1}, 1))
        measure("gather full state (old path)", lambda: gather_full_state(booster, model, optimizer))
        del model, optimizer, scheduler, components
        gc.collect()
        measure("resume (sharded load + DCP)", lambda: resume(config, plugin, booster, manager, directory))
    gathered = [None] * env.world_size
    dist.all_gather_object(gathered, figures)
    if env.is_main_process:
        (Path(work_dir) / f"{mode}.json").write_text(json.dumps(gathered))
    dist.destroy_process_group()


def release_free_memory() -> None:
    """Hand memory freed by earlier phases back to the OS (glibc keeps it otherwise), so each phase
    starts from what the process really holds."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def warm_up_imports() -> None:
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401


def step_once(model, booster):
    """One AdamW step on a short batch, so the optimizer has its state (exp_avg, exp_avg_sq)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    booster.register_optimizer(model, optimizer)
    batch = torch.arange(1, 17).reshape(1, 16)
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer, scheduler


def gather_full_state(booster, model, optimizer) -> None:
    """What a full-state checkpoint does first: the whole model and optimizer state on rank 0's CPU."""
    model_state = booster.full_state_dict(model)
    optimizer_state = booster.full_optimizer_state_dict(optimizer)
    del model_state, optimizer_state


def resume(config, plugin, booster, manager, directory: str) -> None:
    import torch

    from trainer.modeling.models import load_causal_lm

    model = load_causal_lm(config, plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    booster.register_optimizer(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    manager.load(directory, {"model": (model, optimizer, scheduler)})


# ---- the driver -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



def launch(mode: str, ranks: int, model_dir: Path, work_dir: Path) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", __file__, "--rank-mode", mode, str(model_dir), str(work_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    print(f"{mode}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return json.loads((work_dir / f"{mode}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--budget-mib", type=float, default=300.0, help="Stated per-rank memory for weights.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    parser.add_argument("--rank-mode", nargs=3, help=argparse.SUPPRESS)  # internal: one torchrun rank
    args = parser.parse_args()
    if args.rank_mode:
        sys.path.insert(0, str(REPOSITORY))
        run_rank(*args.rank_mode)
        return
    sys.path.insert(0, str(REPOSITORY))
    with tempfile.TemporaryDirectory(prefix="alignflow-sharded-memory-") as scratch:
        model_dir, work_dir = Path(scratch) / "model", Path(scratch) / "work"
        work_dir.mkdir()
        num_parameters = write_model(model_dir, args.hidden, args.layers, args.vocab)
        full_mib = num_parameters * 4 / 2**20
        runs = {mode: launch(mode, args.ranks, model_dir, work_dir) for mode in ("plain", "sharded")}
    report(runs, num_parameters, full_mib, args)


def report(runs: dict[str, list[dict]], num_parameters: int, full_mib: float, args: argparse.Namespace) -> None:
    print(f"model: Llama {args.layers} layers x {args.hidden} hidden, vocab {args.vocab}: "
          f"{num_parameters / 1e6:.1f} M parameters, {full_mib:.0f} MiB in fp32; budget {args.budget_mib:.0f} MiB "
          f"of weights per rank (unsharded: {'exceeds' if full_mib > args.budget_mib else 'fits'}; "
          f"a 1/{args.ranks} shard: {full_mib / args.ranks:.0f} MiB); {args.ranks} gloo ranks")
    baseline = max(rank["baseline"] for ranks in runs.values() for rank in ranks)
    print(f"RssAnon in MiB: the phase's peak (+ its rise over the phase's start); baseline after imports <= "
          f"{baseline:.0f}")
    header = " | ".join(f"rank {r}" for r in range(args.ranks))
    print(f"| phase | {header} |\n|---|" + "---|" * args.ranks)
    rows = []
    for mode, ranks in runs.items():
        for phase in [key for key in ranks[0] if key != "baseline"]:
            cells = [f"{rank[phase]['peak']:.0f} (+{rank[phase]['peak'] - rank[phase]['start']:.0f})" for rank in ranks]
            rows.append({"mode": mode, "phase": phase, "baseline_mib": [rank["baseline"] for rank in ranks],
                         **{key: [rank[phase][key] for rank in ranks] for key in ("start", "peak")}})
            print(f"| {mode}: {phase} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"num_parameters": num_parameters, "full_mib": full_mib, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
