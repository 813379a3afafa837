"""benchmarks/gpu_check.py: its arithmetic, and its CPU smoke run end to end (the GPU run needs a GPU)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)  # import-safe: no torch, no CUDA, no process group at import
GPU_SHAPE, flops_per_token, parse_args, peak_tflops = (gpu_check.GPU_SHAPE, gpu_check.flops_per_token,
                                                        gpu_check.parse_args, gpu_check.peak_tflops)


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("Tesla T4", None),
])
def test_peak_comes_from_the_device_name(name, expected):
    assert peak_tflops(name, None) == expected
    assert peak_tflops(name, 500.0) == 500.0  # --peak-tflops wins


def test_flops_per_token_is_six_n_plus_the_attention_term():
    # 6 * 1e9 + 12 * 22 layers * 2048 hidden * 2048 tokens
    assert flops_per_token(10**9, 22, 2048, 2048) == 6e9 + 12 * 22 * 2048 * 2048


def test_the_gpu_model_is_llama_shaped_and_about_one_billion_parameters():
    shape = GPU_SHAPE
    hidden, layers, mlp, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"], \
        shape["vocab_size"]
    kv = hidden * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden  # q,o + k,v + MLP + 2 norms
    total = layers * per_layer + 2 * vocab * hidden + hidden  # untied embeddings and head, final norm
    assert 1.0e9 < total < 1.2e9


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--seq-len", "0"])
    assert "--seq-len must be at least 1, got 0" in capsys.readouterr().err


def test_dry_run_trains_syncs_and_decodes_on_the_cpu():
    environment = {**os.environ, "MASTER_PORT": "29583"}  # not the default port, which a GPU run may hold
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    table = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines())  # name, value
    assert table["SFT step"].startswith("FSDP2, bf16 autocast")
    assert float(table["tokens/s (all ranks)"]) > 0
    assert table["MFU"].startswith("n/a")  # no peak for a CPU
    assert float(table["last loss"]) > 0
    assert table["decode tokens/s (HF generate, bf16)"].endswith("(2 prompts x 8 steps)")
