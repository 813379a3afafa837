"""The registration gate's statistics: is the candidate better than another model on the same held-out prompts,
by how much, and how sure are we?

The evaluation scores every model on the same prompts, so the comparison is paired, prompt by prompt:
`d_i = candidate_i - reference_i` (the reference is the baseline, or the champion). A gate asks a one-sided
question ("better by at least `min_effect`?"), so each comparison reports the mean difference and a one-sided
lower confidence bound on it at `confidence`:

- **0/1 scores** (a checker's right or wrong): exact. Only the prompts where the two models differ carry
  information: the candidate won `W` of them and lost `L`. Given their number `m = W + L`, `W` is
  Binomial(m, q) and the mean difference is `(m / n) (2q - 1)`; the Clopper-Pearson lower bound on `q`
  (SciPy's `binomtest(...).proportion_ci`) gives the bound on the difference. This is the exact McNemar
  (sign) test turned into an interval.
- **Any other scores** (a reward model's, partial credit, lengths): the paired bootstrap of the mean
  difference (SciPy's `bootstrap`, BCa, 9,999 resamples from a fixed seed, so a decision is repeatable).

A gate opens when the primary comparison's lower bound is at least `min_effect` and every guard holds. A guard
is a metric that must not get worse (non-inferiority): it holds when its lower bound is at least
`-tolerance`, at the same confidence. Which metrics are primary and which are guards is the evaluation's
choice (`trainer.online.evaluate`); docs/pipelines.md explains both to a reader.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BOOTSTRAP_RESAMPLES = 9_999


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """One metric of the candidate against a reference on the same prompts."""

    metric: str
    n: int
    """Prompts compared."""
    difference: float
    """Mean of candidate minus reference (reference minus candidate where lower is better): positive is better."""
    lower_bound: float
    """One-sided lower confidence bound on `difference`."""
    method: str
    """`exact` (0/1 scores) or `bootstrap`."""
    wins: int
    """Prompts where the candidate did better."""
    losses: int
    """Prompts where it did worse."""

    def describe(self, confidence: float) -> str:
        return (f"{self.metric} {self.difference:+.3f} (at least {self.lower_bound:+.3f} at {confidence:.0%} "
                f"confidence, {self.method}; {self.wins} won, {self.losses} lost of {self.n})")


def compare_paired(candidate: Sequence[float], reference: Sequence[float], *, confidence: float, metric: str = "",
                   lower_is_better: bool = False) -> PairedComparison:
    """Compare per-prompt scores of two models on the same prompts (see the module docstring).

    Args:
        candidate: (n,) the candidate's score per prompt.
        reference: (n,) the reference model's scores on the same prompts, in the same order.
        confidence: Level of the one-sided lower bound, in (0.5, 1).
        metric: The metric's name, for messages.
        lower_is_better: Compare `reference - candidate` (a length, an error count).

    Returns:
        The mean difference, its lower bound, and the wins and losses.
    """
    import numpy as np

    ours, theirs = np.asarray(candidate, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if ours.shape != theirs.shape or ours.ndim != 1 or ours.size == 0:
        raise ValueError(f"{metric}: expected two equal, non-empty lists of per-prompt scores, "
                         f"got {ours.shape} and {theirs.shape}")
    differences = (theirs - ours) if lower_is_better else (ours - theirs)  # (n,)
    wins, losses = int((differences > 0).sum()), int((differences < 0).sum())
    binary = bool(np.isin(ours, (0.0, 1.0)).all() and np.isin(theirs, (0.0, 1.0)).all())
    if binary:
        lower = _exact_lower_bound(wins, losses, ours.size, confidence)
    else:
        lower = _bootstrap_lower_bound(differences, confidence)
    return PairedComparison(metric=metric, n=int(ours.size), difference=float(differences.mean()), lower_bound=lower,
                            method="exact" if binary else "bootstrap", wins=wins, losses=losses)


def _exact_lower_bound(wins: int, losses: int, n: int, confidence: float) -> float:
    """Lower bound on the mean difference of 0/1 scores from the prompts the two models split (module docstring)."""
    from scipy.stats import binomtest

    split = wins + losses
    if split == 0:
        return 0.0  # the same answer right or wrong on every prompt: no difference, with certainty
    share_won = binomtest(wins, split, 0.5, alternative="greater").proportion_ci(confidence, method="exact").low
    return split / n * (2.0 * share_won - 1.0)


def _bootstrap_lower_bound(differences, confidence: float) -> float:
    import numpy as np
    from scipy.stats import bootstrap

    if differences.size < 2 or np.ptp(differences) == 0.0:
        # One prompt, or the same difference on every prompt: no spread to resample.
        return float(differences.mean()) if differences.size >= 2 else -math.inf
    result = bootstrap((differences,), np.mean, confidence_level=confidence, alternative="greater", method="BCa",
                       n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(0))
    lower = float(result.confidence_interval.low)
    if not math.isfinite(lower):  # BCa is undefined on some degenerate samples; percentile is not
        result = bootstrap((differences,), np.mean, confidence_level=confidence, alternative="greater",
                           method="percentile", n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(0))
        lower = float(result.confidence_interval.low)
    return lower


@dataclass(frozen=True, slots=True)
class Guard:
    """A metric the candidate must not make worse by more than `tolerance` (in the metric's units)."""

    comparison: PairedComparison
    tolerance: float

    @property
    def holds(self) -> bool:
        return self.comparison.lower_bound >= -self.tolerance


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether the candidate clears the bar against one reference model, and why."""

    reference: str
    """`baseline` or `champion`."""
    primary: PairedComparison
    min_effect: float
    confidence: float
    guards: tuple[Guard, ...] = ()

    @property
    def opens(self) -> bool:
        return self.primary.lower_bound >= self.min_effect and all(guard.holds for guard in self.guards)

    @property
    def reason(self) -> str:
        """One sentence a team lead can read: the decision and what decided it."""
        bar = f"needs at least {self.min_effect:+.3f}"
        primary = self.primary.describe(self.confidence)
        broken = [guard for guard in self.guards if not guard.holds]
        if self.primary.lower_bound < self.min_effect:
            return f"refused against the {self.reference}: {primary}; {bar}"
        if broken:
            return f"refused against the {self.reference} by the guard " + "; ".join(
                f"{g.comparison.describe(self.confidence)}, may not fall below {-g.tolerance:+.3f}" for g in broken)
        return f"opens against the {self.reference}: {primary}; {bar}"

    def metrics(self) -> dict[str, float]:
        """Flat numbers for KFP metrics, MLflow and registry tags (`gate/...` against the baseline,
        `champion_gate/...` against the champion)."""
        prefix = "gate" if self.reference == "baseline" else f"{self.reference}_gate"
        values = {f"{prefix}/n": float(self.primary.n), f"{prefix}/difference": self.primary.difference,
                  f"{prefix}/lower_bound": self.primary.lower_bound, f"{prefix}/min_effect": self.min_effect,
                  f"{prefix}/confidence": self.confidence, f"{prefix}/opens": float(self.opens)}
        for guard in self.guards:
            name = f"{prefix}/guard/{guard.comparison.metric}"
            values |= {f"{name}/difference": guard.comparison.difference,
                       f"{name}/lower_bound": guard.comparison.lower_bound, f"{name}/tolerance": guard.tolerance,
                       f"{name}/holds": float(guard.holds)}
        return values
