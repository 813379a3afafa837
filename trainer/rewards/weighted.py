"""The stage's scorer: the weighted sum of its reward sources, each source's scores kept for the metrics.

`reward.sources` (or the one source `reward.function` / `reward.model_path` names) becomes a list
of (name, weight, scorer); every scorer takes `(batch, prompts, completions, answers)` and returns
(B,) scores. The stage's score is sum_i weight_i * scores_i. A weight-0 source is still scored and
logged, which is how a team watches a signal before training on it.

Logged metrics (each collect step, rank 0's rows): `rewards/<name>/mean` and `rewards/<name>/std`
(population std) of each source's own scores before weighting; counts of remote sources
(`rewards/<name>/failed_rows`, and a judge's `unparsed` and `requests`), cumulative over the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from trainer.config import OnlineStageConfig
from trainer.config.rewards import RewardSourceSpec
from trainer.rollout.scoring import Scorer

if TYPE_CHECKING:
    from trainer.parallel.booster import Plugin


@dataclass(frozen=True, slots=True)
class WeightedSource:
    name: str
    weight: float
    scorer: Scorer
    """Called as scorer(batch, prompts, completions, answers) -> (B,) scores."""


class WeightedScorer:
    """Scores rows with every source and sums the scores by weight; keeps each source's last scores."""

    def __init__(self, sources: list[WeightedSource]) -> None:
        self.sources = sources
        self.last_scores: dict[str, Tensor] = {}

    def __call__(self, batch: dict[str, Tensor], prompts: list[str], completions: list[str],
                 answers: list[Any]) -> Tensor:
        total = torch.zeros(len(prompts), dtype=torch.float32, device=batch["input_ids"].device)  # (B,)
        for source in self.sources:
            scores = source.scorer(batch, prompts, completions, answers).float()  # (B,)
            self.last_scores[source.name] = scores.detach()
            total = total + source.weight * scores
        return total

    def metrics(self) -> dict[str, float]:
        """`rewards/<name>/mean`, `/std` of the last scoring call, and each source's counters."""
        metrics = {}
        for source in self.sources:
            scores = self.last_scores.get(source.name)
            if scores is not None and scores.numel():
                metrics[f"rewards/{source.name}/mean"] = scores.mean().item()
                metrics[f"rewards/{source.name}/std"] = scores.std(unbiased=False).item()
            counters = getattr(source.scorer, "counters", None)
            if counters is not None:
                metrics.update({f"rewards/{source.name}/{key}": value for key, value in counters().items()})
        return metrics


def reward_metrics(scorer: Scorer) -> dict[str, float]:
    """The per-source metrics of a `WeightedScorer`; none for any other scorer."""
    return scorer.metrics() if isinstance(scorer, WeightedScorer) else {}


def source_key(config: OnlineStageConfig, index: int) -> str:
    """The dotted key of source `index` in messages: `reward.sources.<i>`, or the older one-source key."""
    if config.reward.sources is not None:
        return f"reward.sources.{index}"
    return "reward.function" if config.reward.function is not None else "reward.model_path"


def build_source(spec: RewardSourceSpec, key: str, config: OnlineStageConfig, device: torch.device,
                 plugin: Plugin | None = None) -> Scorer:
    """The scorer of one source (`key`: its dotted config key, for messages)."""
    if spec.kind == "function":
        from trainer.rewards.functions import FunctionScorer, load_reward_function

        name_key = key if key == "reward.function" else f"{key}.name"
        return FunctionScorer(load_reward_function(spec.name, key=name_key), config.reward.timeout_seconds)
    if spec.kind == "model":
        from trainer.modeling.models import load_frozen, load_value_model
        from trainer.rewards.reward_model import RewardModelScorer

        path_key = key if key == "reward.model_path" else f"{key}.path"
        return RewardModelScorer(load_frozen(load_value_model, config.model, device, spec.path, key=path_key,
                                             plugin=plugin))
    if spec.kind in ("remote", "judge"):
        from trainer.rewards.service_client import ServiceClient

        client = ServiceClient(spec.label, spec.service, f"{key}.service")
        client.check_reachable()  # a wrong host or port stops the run now, not at the first scoring
        if spec.kind == "remote":
            from trainer.rewards.remote import RemoteScorer

            return RemoteScorer(spec.label, client)
        from trainer.rewards.judge import JudgeScorer

        return JudgeScorer(spec.label, client, spec.judge)
    if spec.kind == "code_tests":
        from trainer.rewards.code_tests import CodeTestsScorer
        from trainer.sandbox import SandboxConfig

        return CodeTestsScorer.build(spec.sandbox or SandboxConfig(), key)
    from trainer.rewards.verifiable import build_verifiable_scorer

    return build_verifiable_scorer(spec.kind, pattern=spec.pattern, normalize=spec.normalize)


def build_weighted_scorer(config: OnlineStageConfig, device: torch.device, plugin: Plugin | None = None) -> WeightedScorer:
    """Every source of `config.reward`, built (functions resolved, models loaded, tokens read, services asked once
    whether they answer) before any training; callers build it before loading the policy."""
    specs = config.reward.resolved_sources()
    return WeightedScorer([WeightedSource(spec.label, spec.weight, build_source(spec, source_key(config, i), config,
                                                                                  device, plugin))
                           for i, spec in enumerate(specs)])
