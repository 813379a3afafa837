"""Verifiable rewards: math answer equivalence (math-verify), exact and normalised match, a format check.

Each is a plain function of one row, `f(completion, answer) -> float` in {0, 1}, wrapped by
`TextScorer` into the stage's scorer interface. Math equivalence uses Hugging Face's `math-verify`
(what TRL's and Open-R1's accuracy rewards use): the answer column and the response are each parsed
(LaTeX, `\\boxed{}`, fractions, plain numbers) and compared symbolically. A row without an answer
scores 0 for `math` and `exact_match`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from trainer.errors import ConfigError
from trainer.rollout.scoring import RowScorer

PARSE_TIMEOUT_SECONDS = 5


def _timeout() -> int | None:
    # math-verify bounds its sympy work with SIGALRM, which only the main thread may set.
    return PARSE_TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def math_equivalence(completion: str, answer: Any) -> float:
    """1.0 when the response's final answer equals `answer` mathematically (math-verify), else 0.0."""
    from math_verify import parse, verify

    if answer is None or str(answer).strip() == "":
        return 0.0
    timeout = _timeout()
    gold = parse(str(answer), parsing_timeout=timeout)
    if not gold:  # bare LaTeX (`\frac{1}{2}`, `\sqrt{2}`) is only found between math delimiters
        gold = parse(f"${answer}$", parsing_timeout=timeout)
    predicted = parse(completion, parsing_timeout=timeout)
    if not gold or not predicted:
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=timeout))


def normalise_text(text: str) -> str:
    """Lower case, single spaces, no surrounding space or final period: `" The  Answer. "` -> `"the answer"`."""
    return " ".join(text.lower().split()).rstrip(".").strip()


def exact_match(completion: str, answer: Any, normalize: bool = True) -> float:
    """1.0 when the response equals `answer` (after `normalise_text` when `normalize`), else 0.0."""
    if answer is None:
        return 0.0
    if normalize:
        return float(normalise_text(completion) == normalise_text(str(answer)))
    return float(completion == str(answer))


def format_match(completion: str, pattern: re.Pattern) -> float:
    """1.0 when the whole response matches `pattern`, else 0.0."""
    return float(pattern.fullmatch(completion) is not None)


class TextScorer(RowScorer):
    """The stage's scorer interface around a per-row check `check(completion, answer) -> float`."""

    def __init__(self, check: Callable[[str, Any], float]) -> None:
        self.check = check

    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """The check of each row's response against its answer."""
        return [self.check(completion, answer) for completion, answer in zip(completions, answers)]


def build_verifiable_scorer(kind: str, *, pattern: str | None = None, normalize: bool = True) -> TextScorer:
    """The scorer of a built-in kind: `math`, `exact_match` or `format` (with its `pattern`)."""
    if kind == "math":
        from importlib.util import find_spec

        if find_spec("math_verify") is None:
            raise ConfigError("reward source kind math needs math-verify: pip install 'alignflow[rewards]'")
        return TextScorer(math_equivalence)
    if kind == "exact_match":
        return TextScorer(lambda completion, answer: exact_match(completion, answer, normalize))
    compiled = re.compile(pattern or "", re.DOTALL)
    return TextScorer(lambda completion, answer: format_match(completion, compiled))
