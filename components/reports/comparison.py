"""The registration gate's side-by-side report: candidate vs baseline vs champion, and sample answers."""

from __future__ import annotations

from typing import Any

from components.reports.html import escape, link, number, page, table
from components.reports.links import model_version_link, run_link


def _difference(candidate: Any, other: Any) -> str:
    if not isinstance(candidate, (int, float)) or not isinstance(other, (int, float)):
        return "-"
    delta = candidate - other
    css = "better" if delta > 0 else "worse" if delta < 0 else ""
    return f"<span class='{css}'>{delta:+.4g}</span>"


def metric_rows(scores: dict[str, float], champion: dict[str, float] | None) -> list[list[str]]:
    """One row per scored metric: candidate, baseline (the evaluation's), champion and the differences."""
    names = [name for name in ("reward", "rm_score") if name in scores]
    rows = []
    for name in names:
        candidate, baseline = scores.get(name), scores.get(f"baseline_{name}")
        theirs = (champion or {}).get(name)
        rows.append([escape(name), number(candidate), number(baseline), _difference(candidate, baseline),
                     number(theirs), _difference(candidate, theirs)])
    return rows


def sample_rows(samples: list[dict], others: list[str]) -> list[list[str]]:
    """Prompt, the candidate's answer and score, then each other model's (`others`: baseline, champion)."""
    return [[escape(s.get("prompt", "")), escape(s.get("response", "")), number(s.get("score"))]
            + [cell for other in others for cell in (escape(s.get(f"{other}_response", "")),
                                                     number(s.get(f"{other}_score")))] for s in samples]


def comparison_html(registration: Any, samples: list[dict], tracking_uri: str = "",
                    environ: dict[str, str] | None = None) -> str:
    """HTML for the KFP UI from a `components.register.registry.Registration` and the evaluation's samples."""
    previous = registration.previous_champion
    verdict = ("is the first version: now the champion" if previous is None else
               f"beats champion version {previous['version']}: now the champion" if registration.is_champion else
               f"does not beat champion version {previous['version']}: registered as candidate only")
    version_url = model_version_link(registration.name, registration.version, tracking_uri, environ)
    body = [f"<p>{link(version_url, f'{registration.name} version {registration.version}')} {escape(verdict)} "
            f"(on <code>{escape(registration.headline)}</code>, the mean score on held-out prompts).</p>"]
    if previous is not None and previous.get("live"):
        body.append(f"<p>Champion version {escape(previous['version'])} was scored by this run's evaluation, on "
                    f"the same held-out prompts as the candidate.</p>")
    elif previous is not None:
        body.append(f"<p class='note'>Champion version {escape(previous['version'])} was not scored by this run's "
                    f"evaluation (it became the champion after it): compared with the scores recorded when it was "
                    f"registered.</p>")
    if registration.same_eval_prompts is False:
        body.append("<p class='note'>The champion was scored on different held-out prompts (their SHA-256 differ): "
                    "the champion comparison is indicative only.</p>")
    body += ["<h2>Metrics</h2>",
             table(["metric", "candidate", "baseline", "vs baseline", "champion", "vs champion"],
                   metric_rows(registration.scores, (previous or {}).get("scores")))]
    runs = [("pipeline run", registration.parent_run_id), ("candidate stage run", registration.stage_run_id)]
    items = [f"<li>{escape(label)}: {link(run_link(registration.experiment_id, run_id, tracking_uri, environ), run_id)}"
             f"</li>" for label, run_id in runs if run_id]
    items.append(f"<li>model files: <code>{escape(registration.model_source)}</code></li>")
    body += ["<h2>Lineage</h2>", "<ul>" + "".join(items) + "</ul>"]
    if samples:
        others = [o for o in ("baseline", "champion") if any(f"{o}_response" in s for s in samples)]
        body += ["<h2>Sample answers, side by side</h2>",
                 table(["prompt", "candidate", "score", *[h for o in others for h in (o, "score")]],
                       sample_rows(samples, others))]
    return page(f"{registration.name}: candidate vs baseline and champion", body)
