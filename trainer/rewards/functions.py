"""A reward function from the platform's allow-list as a reward source: called within a deadline, its values checked.

A reward function is named by `reward.function` and resolved by `trainer.rewards.function_registry`
(built-ins, registered entry points and names, allowed module prefixes; nothing else is imported).
`FunctionScorer` calls it on a worker thread with a deadline and checks every value: a call that
raises, runs past `reward.timeout_seconds` or returns anything but a finite number fails the run
with a `RewardError` naming the function and the row. A call that hangs cannot be killed from
Python; its (daemon) thread is abandoned, and the failed run ends the process that holds it.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from trainer.errors import RewardError
from trainer.rewards.function_registry import RewardAllowList, RewardFunction, resolve_reward_function
from trainer.rollout.scoring import RowScorer

DEFAULT_TIMEOUT_SECONDS = 30.0


def load_reward_function(spec: str, allow_list: RewardAllowList | None = None,
                         key: str = "reward.function") -> RewardFunction:
    """The allowed reward function named `spec` (see `trainer.rewards.function_registry`); ConfigError naming `key` otherwise."""
    return resolve_reward_function(spec, allow_list, key)


class FunctionScorer(RowScorer):
    """Scores decoded responses with a reward function, on a worker thread, each call within a deadline.

    Args:
        reward: The resolved function (`load_reward_function`).
        timeout: Seconds one call may take (a batched function gets this for the whole batch).
    """

    def __init__(self, reward: RewardFunction, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.reward = reward
        self.timeout = timeout

    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """One finite float per row; RewardError naming the function and row otherwise."""
        function = self.reward.function
        if self.reward.is_batched:
            (values,) = self._run([lambda: function(list(prompts), list(completions), answer=list(answers))], prompts)
            return self._check_batch(values, prompts)
        calls = [lambda p=p, c=c, a=a: function(p, c, a) for p, c, a in zip(prompts, completions, answers)]
        return [self._check(value, row, prompts) for row, value in enumerate(self._run(calls, prompts))]

    def _run(self, calls: list[Callable[[], Any]], prompts: list[str]) -> list[Any]:
        """Results of `calls`, made in order on one daemon thread; each must finish within the timeout."""
        results: queue.Queue = queue.Queue()
        abandoned = threading.Event()

        def work() -> None:
            for call in calls:
                if abandoned.is_set():
                    return
                try:
                    results.put((True, call()))
                except BaseException as err:  # noqa: BLE001 - reported on the caller's thread
                    results.put((False, err))
                    return

        threading.Thread(target=work, name=f"reward-{self.reward.name}", daemon=True).start()
        values = []
        for row in range(len(calls)):
            try:
                ok, value = results.get(timeout=self.timeout)
            except queue.Empty:
                abandoned.set()
                raise RewardError(f"{self._where(row, prompts, len(calls))} ran past reward.timeout_seconds "
                                  f"({self.timeout:g} s)") from None
            if not ok:
                first_line = str(value).splitlines()[0] if str(value) else ""
                raise RewardError(f"{self._where(row, prompts, len(calls))} raised "
                                  f"{type(value).__name__}: {first_line}") from value
            values.append(value)
        return values

    def _check_batch(self, values: Any, prompts: list[str]) -> list[float]:
        if isinstance(values, (Tensor, np.ndarray)):
            values = values.tolist()
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or len(values) != len(prompts):
            found = f"{len(values)} values" if isinstance(values, Sequence) else type(values).__name__
            raise RewardError(f"reward function {self.reward.name} (batched) returned {found} for "
                              f"{len(prompts)} rows, expected a list of {len(prompts)} numbers")
        return [self._check(value, row, prompts) for row, value in enumerate(values)]

    def _check(self, value: Any, row: int, prompts: list[str]) -> float:
        if isinstance(value, Tensor) and value.numel() == 1 or isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()  # a one-element tensor or array is a number
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            shown = repr(value) if isinstance(value, numbers.Real) else type(value).__name__
            raise RewardError(f"{self._where(row, prompts)} returned {shown}, expected a finite number")
        return float(value)

    def _where(self, row: int, prompts: list[str], num_calls: int | None = None) -> str:
        """`reward function tiny_addition on row 3 (prompt '1+2=')`, or `... on the batch of 8 rows`."""
        if self.reward.is_batched and num_calls == 1:
            return f"reward function {self.reward.name} (batched) on the batch of {len(prompts)} rows"
        prompt = prompts[row] if row < len(prompts) else ""
        shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        return f"reward function {self.reward.name} on row {row} (prompt {shown!r})"
