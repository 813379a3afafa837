"""GPU check: SFT MFU of a ~1B Llama under FSDP2 + NCCL in bf16 autocast, and HF generate decode tokens/s.

    python benchmarks/gpu_check.py                 # every visible GPU (re-launches itself under torchrun)
    python benchmarks/gpu_check.py --steps 20 --micro-batch-size 4 --seq-len 4096
    python benchmarks/gpu_check.py --peak-tflops 989   # a GPU the peak table does not know
    python benchmarks/gpu_check.py --dry-run       # CPU smoke run on a tiny model (gloo); what the tests run

What runs is alignflow's own path: `FSDP2Plugin` shards every decoder layer and the root over an
NCCL group (world size = visible GPUs; one GPU is a group of one), `Booster` autocasts to bf16 with
fp32 master weights, `SFTObjective` + `train_step` take each optimizer step (fused AdamW from
`build_optimizer`), then rank 0 copies the trained weights into a bf16 copy through
`HFGenerateEngine.load_weights` (the rollout engine's weight sync) and decodes greedily with it; where vLLM
is installed (the trainer image's `vllm` variant) and one GPU runs, the same decode with `rollout.engine:
vllm` follows: its start, the weight push (`reload_weights`) and its decode tokens/s.

The model is random-initialised with the shape of TinyLlama-1.1B (22 layers x 2048 hidden, MLP 5632,
32 heads, 4 KV heads, vocabulary 32000: 1.1 B parameters) on random tokens: speed does not depend on
the weights. MFU counts model FLOPs per token as 6 N + 12 L H T (N parameters, L layers, H hidden,
T sequence length; PaLM, Chowdhery et al. 2022, appendix B) against the bf16 dense peak of the
device (table below, or --peak-tflops) times the world size. Timed steps follow --warmup-steps.
On one H200 the whole run takes about a minute after imports; it prints one summary table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PEAK_BF16_TFLOPS = {  # dense bf16 tensor-core peak by device-name substring; checked in this order
    "H200": 989.0, "GH200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "H800": 989.0, "B200": 2250.0,
    "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L4": 121.0,
}
GPU_SHAPE = {"hidden_size": 2048, "num_hidden_layers": 22, "intermediate_size": 5632, "num_attention_heads": 32,
             "num_key_value_heads": 4, "vocab_size": 32000}
DRY_RUN_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "vocab_size": 128}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed optimizer steps before them")
    parser.add_argument("--micro-batch-size", type=int, default=8, help="sequences per GPU per step")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--decode-batch", type=int, default=16, help="prompts decoded together")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens decoded per prompt")
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per device; default: table")
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU (gloo): checks the script runs")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.steps, args.warmup_steps, args.micro_batch_size, args.seq_len = 2, 1, 2, 32
        args.decode_batch, args.new_tokens = 2, 8
    for name in ("steps", "micro_batch_size", "seq_len", "decode_batch", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def peak_tflops(device_name: str, override: float | None) -> float | None:
    """The bf16 dense peak of one device in TFLOPs: `override`, else the table's entry, else None (MFU not shown)."""
    if override is not None:
        return override
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def flops_per_token(num_parameters: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Model FLOPs of a forward and backward pass per token: 6 N + 12 L H T (PaLM, appendix B)."""
    return 6 * num_parameters + 12 * num_layers * hidden_size * seq_len


def relaunch_under_torchrun(argv: list[str]) -> None:
    """With several GPUs and no torchrun around us, become `torchrun --nproc_per_node=<GPUs> <this script>`."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count > 1 and "RANK" not in os.environ:
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc_per_node={count}", __file__, *argv])


def join_group(dry_run: bool):
    """This process's `DistributedEnv` and device, in a process group even when it is alone (FSDP2 needs one)."""
    import torch
    import torch.distributed as dist

    from trainer.runtime import read_distributed_env

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    env = read_distributed_env()
    if dry_run:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device is visible; use --dry-run for the CPU smoke run")
    else:
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend="gloo" if device.type == "cpu" else "nccl")
    return env, device


def build_model(shape: dict, device, dtype=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="sdpa")
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype) if dtype is not None else model


def train(args: argparse.Namespace, env, device) -> dict[str, float]:
    """Warm-up and timed SFT steps through FSDP2 and the trainer's update step; tokens/s and MFU."""
    import torch

    from trainer.algorithms.sft import SFTObjective
    from trainer.algorithms.update import train_step
    from trainer.config.sections import OptimizerConfig
    from trainer.modeling.optim import build_optimizer
    from trainer.parallel.booster import Booster, FSDP2Plugin

    shape = DRY_RUN_SHAPE if args.dry_run else GPU_SHAPE
    torch.manual_seed(0)
    model = build_model(shape, device)
    num_parameters = sum(p.numel() for p in model.parameters())
    booster = Booster(FSDP2Plugin(env, device), mixed_precision="bf16")
    model, *_ = booster.boost(model)
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-5))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    generator = torch.Generator().manual_seed(env.rank)

    def step() -> dict[str, float]:
        ids = torch.randint(0, shape["vocab_size"], (args.micro_batch_size, args.seq_len), generator=generator)
        batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
        return train_step(booster, model, optimizer, scheduler, [batch], SFTObjective(), max_grad_norm=1.0)

    for _ in range(args.warmup_steps):
        step()
    synchronize(device)
    started = time.perf_counter()
    losses = [step()["loss"] for _ in range(args.steps)]
    synchronize(device)
    seconds = time.perf_counter() - started
    tokens_per_second = env.world_size * args.micro_batch_size * args.seq_len * args.steps / seconds
    achieved = tokens_per_second * flops_per_token(num_parameters, shape["num_hidden_layers"], shape["hidden_size"],
                                                   args.seq_len)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(device_name, args.peak_tflops)
    return {"model": model, "booster": booster, "shape": shape, "device_name": device_name,
            "num_parameters": num_parameters, "step_seconds": seconds / args.steps, "loss": losses[-1],
            "tokens_per_second": tokens_per_second, "achieved_tflops": achieved / 1e12 / env.world_size,
            "peak_tflops": peak, "mfu": achieved / (peak * 1e12 * env.world_size) if peak else None,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def decode(args: argparse.Namespace, trained: dict, env, device) -> dict[str, float]:
    """Sync the trained weights into a bf16 copy (every rank gathers; rank 0 loads) and time greedy decoding."""
    import torch

    from trainer.config import GenerationConfig
    from trainer.rollout.engines import HFGenerateEngine

    started = time.perf_counter()
    state = trained["booster"].full_state_dict(trained["model"])  # collective: rank 0 gets the full weights
    if not env.is_main_process:
        return {}
    engine = HFGenerateEngine(build_model(trained["shape"], device, torch.bfloat16))
    engine.load_weights(state)
    sync_seconds = time.perf_counter() - started
    prompts = torch.randint(0, trained["shape"]["vocab_size"], (args.decode_batch, 32), device=device)
    options = GenerationConfig(max_new_tokens=args.new_tokens, temperature=0)
    kwargs = {"stop_token_ids": [], "pad_token_id": 0}
    engine.generate(prompts[:, :8], torch.ones_like(prompts[:, :8]), options.model_copy(update={"max_new_tokens": 4}),
                    **kwargs)  # warm-up: kernels, allocator
    synchronize(device)
    started = time.perf_counter()
    responses = engine.generate(prompts, torch.ones_like(prompts), options, **kwargs).ids  # (B, R)
    synchronize(device)
    seconds = time.perf_counter() - started
    decoded = {"decode_tokens_per_second": responses.numel() / seconds, "decode_steps": responses.shape[1],
               "weight_sync_seconds": sync_seconds}
    if can_run_vllm(args, env):
        decoded |= decode_with_vllm(trained["model"], trained["shape"], prompts, options)
    return decoded


def can_run_vllm(args: argparse.Namespace, env) -> bool:
    """vLLM's engine joins the process's group (every rank would have to start one): one GPU, vLLM installed."""
    from importlib.util import find_spec

    return not args.dry_run and env.world_size == 1 and find_spec("vllm") is not None


def decode_with_vllm(policy, shape: dict, prompts, options) -> dict[str, float]:
    """The same greedy decode with `rollout.engine: vllm` (bf16): start, weight sync, tokens/s.

    The trained weights go in as the online stages send them (`sync_from`: FSDP2 shards gathered one
    tensor at a time and streamed into vLLM's `reload_weights`).
    """
    import tempfile

    import torch

    from trainer.config import RolloutConfig
    from trainer.rollout.engine_registry import build_rollout_engine
    from trainer.rollout.engines import EngineSetup

    with tempfile.TemporaryDirectory() as directory:
        build_model(shape, torch.device("cpu"), torch.bfloat16).save_pretrained(directory)  # config, initial weights
        started = time.perf_counter()
        engine = build_rollout_engine(RolloutConfig(engine="vllm", vllm={"dtype": "bfloat16"}), None,
                                      EngineSetup(directory))
        start_seconds = time.perf_counter() - started
    try:
        started = time.perf_counter()
        engine.sync_from(policy)  # the trained weights, as the online stages push them
        sync_seconds = time.perf_counter() - started
        mask = torch.ones_like(prompts)
        engine.generate(prompts[:, :8], mask[:, :8], options.model_copy(update={"max_new_tokens": 4}),
                        stop_token_ids=[], pad_token_id=0)  # warm-up
        started = time.perf_counter()
        responses = engine.generate(prompts, mask, options, stop_token_ids=[], pad_token_id=0).ids
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    return {"vllm_decode_tokens_per_second": responses.numel() / seconds, "vllm_start_seconds": start_seconds,
            "vllm_weight_sync_seconds": sync_seconds}


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary_rows(args: argparse.Namespace, trained: dict, decoded: dict, world_size: int) -> list[tuple[str, str]]:
    mfu = trained["mfu"]
    peak = trained["peak_tflops"]
    return [
        ("device", f"{trained['device_name']} x {world_size}"),
        ("model", f"Llama {trained['shape']['num_hidden_layers']}x{trained['shape']['hidden_size']}, "
                  f"{trained['num_parameters'] / 1e6:.1f} M parameters"),
        ("SFT step", f"FSDP2, bf16 autocast, {args.micro_batch_size} x {args.seq_len} tokens per rank"),
        ("step time", f"{trained['step_seconds'] * 1e3:.1f} ms (mean of {args.steps})"),
        ("tokens/s (all ranks)", f"{trained['tokens_per_second']:.0f}"),
        ("achieved TFLOPs per device", f"{trained['achieved_tflops']:.1f}"),
        ("MFU", f"{mfu:.1%} of {peak:.0f} TFLOPs bf16 peak (goal >= 50%)" if mfu is not None
         else "n/a (unknown device peak: pass --peak-tflops)"),
        ("peak GPU memory", f"{trained['peak_memory_gib']:.1f} GiB" if trained["peak_memory_gib"] else "n/a"),
        ("last loss", f"{trained['loss']:.4f}"),
        ("weight sync into rollout engine", f"{decoded['weight_sync_seconds']:.1f} s"),
        ("decode tokens/s (HF generate, bf16)",
         f"{decoded['decode_tokens_per_second']:.0f} ({args.decode_batch} prompts x {decoded['decode_steps']} steps)"),
    ] + ([("vLLM engine start", f"{decoded['vllm_start_seconds']:.1f} s"),
          ("weight sync into vLLM (reload_weights)", f"{decoded['vllm_weight_sync_seconds']:.2f} s"),
          ("decode tokens/s (vLLM, bf16)", f"{decoded['vllm_decode_tokens_per_second']:.0f}")]
         if "vllm_decode_tokens_per_second" in decoded else [("vLLM", "not run (not installed, or more than 1 GPU)")])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not args.dry_run:
        relaunch_under_torchrun(argv)
    import torch.distributed as dist

    env, device = join_group(args.dry_run)
    try:
        trained = train(args, env, device)
        decoded = decode(args, trained, env, device)
        if env.is_main_process:
            rows = summary_rows(args, trained, decoded, env.world_size)
            width = max(len(name) for name, _ in rows)
            print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
    raise SystemExit(main())
