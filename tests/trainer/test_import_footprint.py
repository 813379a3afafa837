"""Importing the trainer's entry points must not import heavy modules that only some runs use.

Every training child imports these modules and holds whatever they import until it exits, so an
eager import of, say, `torch.distributed.checkpoint` (DTensor and sympy, ~50 MB of RSS) costs every
run that never writes a sharded checkpoint. The modules below are imported inside the functions
that need them; this test fails if one of them comes back to module level. (A run that loads a
transformers model still imports DCP through transformers' own modeling code; that is not ours to
change, and the check here is on what alignflow adds.)
"""

from __future__ import annotations

import subprocess
import sys

ENTRY_POINTS = (
    "trainer.__main__",
    "trainer.config",
    "trainer.supervised.stages",
    "trainer.online.stages",
    "trainer.lifecycle.context",
    "trainer.lifecycle.resume",
    "trainer.checkpointing.checkpoint",
    "trainer.parallel.booster",
)

# Heavy modules a training child does not need at import: sharded checkpoints (DCP, which pulls in
# DTensor and sympy), compilation, S3, dataset formats, tracking, LoRA and pipelines.
LAZY = (
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "torch._dynamo",
    "sympy",
    "boto3",
    "botocore",
    "pyarrow",
    "datasets",
    "pandas",
    "mlflow",
    "peft",
    "kfp",
    "scipy",
    "accelerate",
)


def test_entry_points_leave_heavy_modules_unimported():
    script = (f"import sys; import {', '.join(ENTRY_POINTS)}; "
              f"print(' '.join(name for name in {LAZY!r} if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert loaded == [], f"imported eagerly by the trainer's entry points: {loaded}"


def test_check_sees_an_eager_import():
    """The same check in a process that does import DCP reports it (the test above can fail)."""
    script = (f"import sys; import trainer.supervised.stages, torch.distributed.checkpoint; "
              f"print(' '.join(name for name in {LAZY!r} if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {"torch.distributed.checkpoint", "sympy"} <= set(result.stdout.split())


def test_help_config_and_a_bad_config_answer_without_loading_torch(tmp_path):
    """`python -m trainer` reads its flags and its config before any stage module: `--help-config` and a
    config error end without importing torch (seconds per process; the stages import it when they run)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: out\nmodel: {path: m}\ndata: {train_path: t}\nno_such_key: 1\n")
    script = ("import sys, trainer.__main__ as entry\n"
              "codes = [entry.main(['sft', '--help-config']), entry.main(['sft', '--config', sys.argv[1]])]\n"
              "print(codes, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[0, 2] False"
    assert "no_such_key" in result.stderr
