"""A reward function named by a pipeline parameter cannot call arbitrary code (issue 11, item 1).

The issue's probe: `reward.function: os:execl` with the prompt `/usr/bin/touch` and an answer that
names a file. The trainer called `os.execl("/usr/bin/touch", completion, answer)`, was replaced by
`touch`, the file appeared, and the run exited 0. Now the name is refused before anything is
imported or trained, in one line that lists the allowed functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_config, stage_dict
from trainer.errors import RewardError
from trainer.online.stages import run_online_stage

REPO_ROOT = Path(__file__).resolve().parents[2]


def grpo_dict(output: Path, model: Path, prompts: Path, reward_function: str) -> dict:
    return stage_dict("grpo", output, model, prompts, train={"micro_batch_size": 4}, generation={"max_new_tokens": 4},
                      reward={"function": reward_function},
                      grpo={"num_episodes": 1, "rollout_batch_size": 2, "mini_batch_size": 4, "num_generations": 2})


def test_os_execl_reward_is_refused_and_runs_nothing(tmp_path, tiny_model):
    marker = tmp_path / "created-by-touch"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "/usr/bin/touch", "answer": str(marker)}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(grpo_dict(tmp_path / "out", tiny_model, prompts, "os:execl")))
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}

    result = subprocess.run([sys.executable, "-m", "trainer", "grpo", "--config", str(config)], cwd=REPO_ROOT,
                            env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)

    assert not marker.exists(), "the reward function ran /usr/bin/touch"
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "Error" in line]
    assert line.startswith("ConfigError: reward.function is 'os:execl', which is not an allowed reward function; "
                           "allowed: tiny_addition"), line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_reward_function_that_raises_fails_the_run_naming_function_and_row(tmp_path, monkeypatch, tiny_model,
                                                                           task_files):
    # The platform registered it, so it runs; its failure is one line, not a traceback from a thread.
    monkeypatch.setenv("ALIGNFLOW_REWARD_FUNCTIONS", "picky=tests.trainer.online.rewards:raises_on_second_row")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in ("1+1=", "2+2=")))
    config = make_config("grpo", tmp_path / "out", tiny_model, prompts, train={"micro_batch_size": 4},
                         generation={"max_new_tokens": 4}, reward={"function": "picky"},
                         grpo={"num_episodes": 1, "rollout_batch_size": 2, "mini_batch_size": 4,
                               "num_generations": 2})
    with pytest.raises(RewardError, match=r"^reward function picky on row \d \(prompt '2\+2='\) raised ValueError: "
                                          r"cannot score this$"):
        run_online_stage(config)
