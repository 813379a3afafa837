"""`code_tests`: the response's program runs in the real sandbox on the row's cases, graded outside it."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import make_config
from tests.trainer.sandbox.conftest import TOKEN
from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.errors import RewardError
from trainer.rewards.code_tests import program_of
from trainer.rewards.weighted import build_weighted_scorer, reward_metrics

# Read two integers, print their sum; the third case has two lines of input.
CASES = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"},
                    {"input": "5\n5\n", "output": "10\n\n"}])
SOLVES = "```python\nimport sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n```"
FIRST_LINE_ONLY = "Here it is:\n```\na, b = map(int, input().split())\nprint(a + b)  \n```"  # case 3: one line
# Looks for the expected output, prints what it finds, exits 0 before any check could run: passes nothing.
GAMES_THE_GRADER = "import glob, os\nprint(*glob.glob('/tmp/**', recursive=True), os.environ)\nos._exit(0)"
SLEEPS = "import time\ntime.sleep(60)"
CRASHES = "raise SystemExit(3)"
BATCH = {"input_ids": torch.zeros(6, 4, dtype=torch.long)}


@pytest.fixture(scope="module")
def scorer(tmp_path_factory, tiny_model, task_files):
    skip_without_the_local_sandbox()  # an older kernel cannot hold it: skipped, naming the kernel it needs
    sandbox = {"backend": "local", "limits": {"wall_seconds": 2, "cpu_seconds": 2}}
    config = make_config("grpo", tmp_path_factory.mktemp("code"), tiny_model, task_files["prompts"],
                         reward={"sources": [{"kind": "code_tests", "name": "tests", "sandbox": sandbox}]})
    return build_weighted_scorer(config, torch.device("cpu"))


def test_the_score_is_the_share_of_cases_passed_and_nothing_a_program_prints_or_exits_with_passes_one(scorer):
    responses = [SOLVES, FIRST_LINE_ONLY, GAMES_THE_GRADER, SLEEPS, CRASHES, SOLVES]
    answers = [CASES, json.loads(CASES), CASES, CASES, CASES, None]  # JSON text or a list; no cases scores 0
    scores = scorer(BATCH, [""] * 6, responses, answers)
    assert scores.tolist() == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    metrics = reward_metrics(scorer)
    assert metrics["rewards/tests/mean"] == pytest.approx((1 + 2 / 3) / 6)
    assert (metrics["rewards/tests/cases"], metrics["rewards/tests/cases_passed"]) == (15.0, 5.0)
    # CRASHES three times, FIRST_LINE_ONLY once (`input()` reads "5", one number for two names).
    assert (metrics["rewards/tests/timed_out"], metrics["rewards/tests/crashed"]) == (3.0, 4.0)


def test_a_row_whose_answer_is_not_test_cases_stops_the_run_naming_it(scorer):
    with pytest.raises(RewardError, match=r"^code_tests: row 1: answer must be a list of \{\"input\": str"):
        scorer({"input_ids": BATCH["input_ids"][:2]}, ["", ""], [SOLVES, SOLVES],
               [CASES, json.dumps({"input": "1 2"})])
    with pytest.raises(RewardError, match=r"^code_tests: row 0: answer is not JSON test cases"):
        scorer({"input_ids": BATCH["input_ids"][:1]}, [""], [SOLVES], ["1 2 -> 3"])


def test_the_program_is_the_last_fenced_block_else_the_whole_response():
    assert program_of("a\n```py\nx = 1\n```\nthen\n```python\nprint(2)\n```\n") == "print(2)\n"
    assert program_of("print(1)") == "print(1)"


def test_the_charts_sandbox_service_grades_alike(sandbox_service, tmp_path, tiny_model, task_files, monkeypatch):
    """backend remote: the same programs through the real sandbox service on loopback (as the image's uid)."""
    url, _ = sandbox_service
    monkeypatch.setenv("ALIGNFLOW_SANDBOX_TOKEN", TOKEN)  # what the chart maps from the service's Secret
    sandbox = {"backend": "remote", "url": url, "limits": {"wall_seconds": 2, "cpu_seconds": 2}}
    config = make_config("grpo", tmp_path, tiny_model, task_files["prompts"],
                         reward={"sources": [{"kind": "code_tests", "sandbox": sandbox}]})
    remote = build_weighted_scorer(config, torch.device("cpu"))
    scores = remote({"input_ids": BATCH["input_ids"][:3]}, [""] * 3, [SOLVES, FIRST_LINE_ONLY, GAMES_THE_GRADER],
                    [CASES] * 3)
    assert scores.tolist() == pytest.approx([1.0, 2 / 3, 0.0])
