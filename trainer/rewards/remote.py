"""A reward service: batched JSON over HTTP, scored rows checked one by one.

Request (POST to `service.url`, `Content-Type: application/json`, `Authorization: Bearer <token>`
when a token is configured), at most `service.batch_size` rows each, `max_concurrency` at once:

    {"prompts": ["1+2=", ...], "completions": ["3", ...], "answers": ["3", ...]}

`answers` holds each prompt row's `answer` column (null where a row has none). Response (HTTP 200):

    {"scores": [1.0, ...]}

one finite number per row, in order. A wrong count, a NaN or infinity, or anything but a number
fails the run with one `RewardError` naming the service and the step's row. A service that stays
unreachable through the retries (`trainer.rewards.service_client` has the failure rule) fails the
run (`on_failure: fail`) or scores the step's unanswered rows 0 with one warning (`on_failure: zero`),
counted in `rewards/<name>/failed_rows`.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

from trainer.errors import RewardError
from trainer.rewards.service_client import ServiceClient, ServiceUnavailable
from trainer.rollout.scoring import RowScorer

logger = logging.getLogger(__name__)


def check_score(value: Any, where: str, row: int, prompts: list[str]) -> float:
    """`value` as a float if it is a finite number; RewardError naming `where` and the row otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        prompt = prompts[row] if len(prompts[row]) <= 60 else prompts[row][:57] + "..."
        raise RewardError(f"{where} scored row {row} (prompt {prompt!r}) {value!r}, expected a finite number")
    return float(value)


class RemoteScorer(RowScorer):
    """Scores rows with a reward service (the module docstring has the schema).

    Args:
        name: The source's name in metrics and messages.
        client: The service's client (URL, retries, concurrency, token).
    """

    def __init__(self, name: str, client: ServiceClient) -> None:
        self.name = name
        self.client = client
        self.failed_rows = 0

    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """One finite float per row (0 for rows of a batch the service never answered, with on_failure zero)."""
        options = self.client.options
        starts = range(0, len(prompts), options.batch_size)
        bodies = [{"prompts": prompts[s:s + options.batch_size], "completions": completions[s:s + options.batch_size],
                   "answers": [None if a is None else str(a) for a in answers[s:s + options.batch_size]]}
                  for s in starts]
        scores: list[float] = []
        failure, failed_rows = None, 0
        for start, body, answer in zip(starts, bodies, self.client.post_all(options.url, bodies)):
            rows = len(body["prompts"])
            if isinstance(answer, ServiceUnavailable):
                if options.on_failure == "fail":
                    raise RewardError(f"{answer}; on_failure is fail, so the run stops") from None
                failure, failed_rows = answer, failed_rows + rows
                scores.extend([0.0] * rows)
                continue
            try:
                scores.extend(self._check(answer, start, rows, prompts))
            except RewardError as err:  # the answer may quote the token back
                raise RewardError(self.client.blank(str(err))) from None
        if failure is not None:
            logger.warning("%s; scoring this step's %d unanswered rows 0 (on_failure zero)", failure, failed_rows)
            self.failed_rows += failed_rows
        return scores

    def counters(self) -> dict[str, float]:
        """Counts logged as `rewards/<name>/<counter>`."""
        return {"failed_rows": float(self.failed_rows)}

    def _check(self, answer: Any, start: int, rows: int, prompts: list[str]) -> list[float]:
        where = f"reward service {self.name} ({self.client.options.url})"
        values = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(values, list):
            found = f"a {type(answer).__name__} without a `scores` list" if values is None else \
                f"`scores` as a {type(values).__name__}"
            raise RewardError(f"{where} answered {found} for rows {start}-{start + rows - 1}, expected "
                              '{"scores": [one number per row]}')
        if len(values) != rows:
            raise RewardError(f"{where} returned {len(values)} scores for the batch of rows {start}-{start + rows - 1} "
                              f"({rows} rows), expected {rows}")
        return [check_score(value, where, start + index, prompts) for index, value in enumerate(values)]
