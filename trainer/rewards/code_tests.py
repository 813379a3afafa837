"""Code rewards: the response's program runs in the sandbox on the row's test cases; the score is the share it passes.

A row's `answer` holds its test cases, as competitive-programming sets carry them: a list (or its
JSON text) of `{"input": "...", "output": "..."}`. The program is the last fenced code block of the
response (```` ```python ```` or a bare fence), else the whole response. Each case is one run in the
sandbox (`trainer.sandbox`, local or the chart's service): the program reads the case's
input on stdin, and it passes when its stdout equals the case's output, compared line by line with
trailing spaces and trailing empty lines dropped. The score is passed cases / cases, in [0, 1].

Grading happens here, outside the sandbox: the program never sees the expected output, so nothing
it prints, and no way it exits, passes a case it did not solve. A row whose `answer` has no cases
scores 0; one whose `answer` is not such a list stops the run with a RewardError naming the row.
Logged, cumulative over the run: `rewards/<name>/cases`, `rewards/<name>/cases_passed`,
`rewards/<name>/timed_out` and `rewards/<name>/crashed` (a non-zero exit).
"""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainer.errors import ConfigError, RewardError
from trainer.rollout.scoring import RowScorer

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
# Put before the program: the case's input becomes stdin (with `.buffer`, as sys.stdin has), so `input()`,
# `sys.stdin.read()` and `sys.stdin.buffer.read()` all read it.
_STDIN_PRELUDE = "import io as _io, sys as _sys\n_sys.stdin = _io.TextIOWrapper(_io.BytesIO({data!r}), encoding='utf-8')\n"


def program_of(response: str) -> str:
    """The last fenced code block of `response`, else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def cases_of(answer: Any, row: int) -> list[tuple[str, str]]:
    """The (input, output) pairs of a row's `answer`; RewardError naming the row if it is not a list of them."""
    if answer is None or answer == "":
        return []
    cases = answer
    if isinstance(answer, str):
        try:
            cases = json.loads(answer)
        except json.JSONDecodeError as err:
            raise RewardError(f"code_tests: row {row}: answer is not JSON test cases ({err})") from None
    if not isinstance(cases, list) or not all(isinstance(case, dict) and isinstance(case.get("input"), str)
                                              and isinstance(case.get("output"), str) for case in cases):
        raise RewardError(f"code_tests: row {row}: answer must be a list of {{\"input\": str, \"output\": str}}, "
                          f"got {str(answer)[:100]!r}")
    return [(case["input"], case["output"]) for case in cases]


def same_output(printed: str, expected: str) -> bool:
    """Equal line by line after dropping trailing spaces on each line and trailing empty lines."""
    def lines(text: str) -> list[str]:
        kept = [line.rstrip() for line in text.splitlines()]
        while kept and not kept[-1]:
            kept.pop()
        return kept
    return lines(printed) == lines(expected)


class CodeTestsScorer(RowScorer):
    """Scores each response by the share of its row's test cases its program passes in the sandbox."""

    def __init__(self, sandbox: Any, limits: Any, max_concurrency: int = 4) -> None:
        self.sandbox, self.limits, self.max_concurrency = sandbox, limits, max_concurrency
        self._counts = {"cases": 0, "cases_passed": 0, "timed_out": 0, "crashed": 0}
        self._lock = threading.Lock()

    @classmethod
    def build(cls, config: Any, key: str) -> CodeTestsScorer:
        """The scorer for a `sandbox` section; checks once that the sandbox starts and holds here, else ConfigError."""
        from trainer.sandbox import SandboxUnavailableError, build_sandbox

        try:
            sandbox = build_sandbox(config)
            sandbox.check(config.limits)
        except SandboxUnavailableError as err:
            raise ConfigError(f"{key}.sandbox: {err}") from None
        return cls(sandbox, config.limits)

    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """The share of each row's test cases its response's program passes (0 for a row with none)."""
        runs = [(row, program_of(completion), case) for row, (completion, answer)
                in enumerate(zip(completions, answers)) for case in cases_of(answer, row)]
        passed, cases = [0] * len(completions), [0] * len(completions)
        with ThreadPoolExecutor(self.max_concurrency) as pool:
            for (row, _, _), ok in zip(runs, pool.map(lambda run: self._passes(run[1], *run[2]), runs)):
                passed[row] += ok
                cases[row] += 1
        return [done / total if total else 0.0 for done, total in zip(passed, cases)]

    def _passes(self, program: str, stdin: str, expected: str) -> bool:
        result = self.sandbox.run_python(_STDIN_PRELUDE.format(data=stdin.encode()) + program, limits=self.limits)
        ok = result.exit_code == 0 and not result.timed_out and same_output(result.stdout, expected)
        with self._lock:
            self._counts["cases"] += 1
            self._counts["cases_passed"] += ok
            self._counts["timed_out"] += result.timed_out
            self._counts["crashed"] += not result.timed_out and result.exit_code not in (0, None)
        return ok

    def counters(self) -> dict[str, float]:
        with self._lock:
            return {key: float(value) for key, value in self._counts.items()}
