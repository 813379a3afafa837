"""An LLM judge on any OpenAI-compatible chat endpoint: a rubric per row, a score read from the reply.

Each row becomes one `POST <service.url>/chat/completions` request (`model`, the optional system
message and the rubric with {prompt}, {response} and {answer} filled in, `temperature` 0,
`max_tokens`). Identical requests within one scoring call (one collect step: GRPO's identical
responses to one prompt, for instance) are sent once and their reply reused.

Score parsing, and its failure rule: the reply's text (`choices[0].message.content`) is searched
for `score_pattern`; the last match's first group is the score. A reply with no match, or a score
outside [min_score, max_score], is unparsed: the run fails with one line naming the judge, the row
and the reply's start (`on_unparsed: fail`), or the row scores 0 and is counted
(`rewards/<name>/unparsed`; `on_unparsed: zero`). A parsed score s becomes the reward
(s - min_score) / (max_score - min_score), in [0, 1]. A reply without `choices[0].message.content`
is a malformed answer and always fails the run. An unreachable judge follows `service.on_failure`
as a reward service does (`rewards/<name>/failed_rows`, one warning per step), with the same failure
rule (`trainer.rewards.service_client`): once one request has failed for good, the step's others stop.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from trainer.config.rewards import JudgeConfig
from trainer.errors import RewardError
from trainer.rewards.service_client import ServiceClient, ServiceUnavailable
from trainer.rollout.scoring import RowScorer

logger = logging.getLogger(__name__)


def parse_score(reply: str, options: JudgeConfig) -> float | None:
    """The reward in [0, 1] that `reply` states, or None when it states none within the rubric's range."""
    matches = list(re.finditer(options.score_pattern, reply))
    if not matches:
        return None
    try:
        score = float(matches[-1].group(1))
    except (TypeError, ValueError):
        return None
    if not options.min_score <= score <= options.max_score:
        return None
    return (score - options.min_score) / (options.max_score - options.min_score)


def reply_text(answer: Any) -> str | None:
    """`choices[0].message.content` of a chat-completions answer, or None if it has none."""
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


class JudgeScorer(RowScorer):
    """Scores rows by asking an LLM judge (the module docstring has the protocol and the failure rule).

    Args:
        name: The source's name in metrics and messages.
        client: The endpoint's client (base URL, retries, concurrency, token).
        options: The rubric and how replies are read.
    """

    def __init__(self, name: str, client: ServiceClient, options: JudgeConfig) -> None:
        self.name = name
        self.client = client
        self.options = options
        self.unparsed = 0
        self.failed_rows = 0
        self.requests = 0

    def score(self, prompts: list[str], completions: list[str], answers: list[Any]) -> list[float]:
        """One reward in [0, 1] per row; identical requests are sent once."""
        requests = [self.request(p, c, a) for p, c, a in zip(prompts, completions, answers)]
        keys = [json.dumps(request, sort_keys=True) for request in requests]
        unique = list(dict.fromkeys(keys))  # first occurrence order
        bodies = [requests[keys.index(key)] for key in unique]
        self.requests += len(bodies)
        replies = dict(zip(unique, self.client.post_all(self.client.options.url.rstrip("/") + "/chat/completions",
                                                        bodies)))
        rewards = [self._reward(replies[key], row, prompts) for row, key in enumerate(keys)]
        failures = [reply for reply in replies.values() if isinstance(reply, ServiceUnavailable)]
        if failures:  # only reached with on_failure zero: `_reward` raised otherwise
            failed_rows = sum(isinstance(replies[key], ServiceUnavailable) for key in keys)
            logger.warning("%s; scoring this step's %d unanswered rows 0 (on_failure zero)", failures[0], failed_rows)
        return rewards

    def request(self, prompt: str, completion: str, answer: Any) -> dict[str, Any]:
        """The chat-completions body that asks the judge about one row."""
        rubric = self.options.rubric.format(prompt=prompt, response=completion, answer="" if answer is None else answer)
        messages = [{"role": "user", "content": rubric}]
        if self.options.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.options.system_prompt})
        return {"model": self.options.model, "messages": messages, "temperature": 0.0,
                "max_tokens": self.options.max_tokens}

    def counters(self) -> dict[str, float]:
        """Counts logged as `rewards/<name>/<counter>`."""
        return {"unparsed": float(self.unparsed), "failed_rows": float(self.failed_rows),
                "requests": float(self.requests)}

    def _reward(self, answer: Any, row: int, prompts: list[str]) -> float:
        where = f"judge {self.name} ({self.client.options.url}) on row {row} (prompt {prompts[row][:60]!r})"
        if isinstance(answer, ServiceUnavailable):
            if self.client.options.on_failure == "fail":
                raise RewardError(f"{answer}; on_failure is fail, so the run stops") from None
            self.failed_rows += 1
            return 0.0
        text = reply_text(answer)
        text = None if text is None else self.client.blank(text)  # the reply may quote the token back
        if text is None:
            raise RewardError(f"{where}: the answer has no choices[0].message.content, expected an OpenAI "
                              f"chat-completions answer")
        reward = parse_score(text, self.options)
        if reward is not None:
            return reward
        if self.options.on_unparsed == "fail":
            raise RewardError(f"{where}: no score in [{self.options.min_score:g}, {self.options.max_score:g}] "
                              f"matching judge.score_pattern in the reply {text[:80]!r}")
        self.unparsed += 1
        logger.warning("%s: unparsed reply %r scored 0", where, text[:80])
        return 0.0
