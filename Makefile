# The two commands of the README. Both create or reuse .venv and install through pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_DIR ?= demo-output

.PHONY: test demo benchmark venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: on this machine 2.13.0 is a local CPU build; anything that asks for
	# plain `torch` later is then already satisfied.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

test: venv
	$(PY) -m ruff check trainer components pipelines tests benchmarks
	$(PY) -m pytest

# The three pipelines on the tiny task, through kfp.local and the local launcher (about 3 minutes).
demo: venv
	$(VENV)/bin/alignflow run rlhf-ppo --root $(DEMO_DIR)
	$(VENV)/bin/alignflow run rlhf-dpo --root $(DEMO_DIR)
	$(VENV)/bin/alignflow run rlhf-grpo --root $(DEMO_DIR)

benchmark: venv
	$(PY) benchmarks/supervised.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache
