"""Scoring a policy's responses on held-out prompts: the online stages' evaluation and `python -m trainer evaluate`.

`score_rows` is the one evaluation loop: prompts split across ranks, responses generated and
scored by a `Rollout` (`trainer.rollout`), the sum all-reduced. Answers are sampled by the config's
`rollout.engine` (`hf` by default; `vllm` loads each saved model into its own engine). `run_evaluation` is what the pipelines'
`evaluate_model` component launches as its own job (so generation runs on a GPU node): it scores
a candidate, a baseline and, when given, the registry's champion with the checkable reward
function and, optionally, a reward model, and writes `final_metrics.json` (`reward`,
`baseline_reward`, `champion_reward`, `improvement`, `rm_score`, `baseline_rm_score`,
`champion_rm_score`; with an `environment`, each model's `tool_calls_per_episode` and
`valid_tool_call_fraction` too; the gate's `gate/*` and `champion_gate/*` numbers), `samples.jsonl` (the
models' answers side by side), `gate.json` (each decision and the sentence that explains it) and
`per_prompt.jsonl` (every held-out row's values per model: the means over its `samples_per_prompt` answers,
sampled from the same seed for every model). The gate compares the models prompt by prompt
(`judge`, with the statistics of `trainer.online.paired_gate`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from trainer.config import EvaluateConfig, ModelConfig
from trainer.data.dataset import load_rows
from trainer.lifecycle import collector
from trainer.lifecycle.resume import check_output_directories
from trainer.modeling.models import load_causal_lm, load_frozen, load_tokenizer, load_value_model
from trainer.online.paired_gate import GateDecision, Guard, PairedComparison, compare_paired
from trainer.rewards.functions import FunctionScorer, load_reward_function
from trainer.rewards.reward_model import RewardModelScorer
from trainer.rollout.builder import build_agent, build_rollout
from trainer.rollout.engines import EngineSetup
from trainer.rollout.interface import Rollout, ScoredRollout
from trainer.rollout.scoring import Scorer
from trainer.runtime import all_reduce_sum, init_process_group, pick_device, read_distributed_env
from trainer.storage import get_storage, join_uri

if TYPE_CHECKING:
    from trainer.rollout.multi_turn import Agent

logger = logging.getLogger(__name__)
SAMPLES_KEPT = 10
# Metric-name prefix of each model an evaluation scores, with the config key that names it.
MODEL_KEYS = {"": "model.path", "baseline_": "baseline_path", "champion_": "champion_path"}


# What an evaluation records per row besides its scores: the response's length in model tokens, and for
# multi-turn episodes the tool calls made and how many of them failed.
ROW_FIELDS = ("response_tokens", "tool_calls", "tool_errors")


@torch.no_grad()
def score_rows(rollout: Rollout, rows: list[dict], other_scorers: Sequence[Scorer] = (), rank: int = 0,
               world_size: int = 1, batch_size: int = 64) -> tuple[torch.Tensor, list[ScoredRollout]]:
    """Every row's scores from `rollout`'s responses, over all ranks; this rank's rows are `rows[rank::world_size]`.

    The rollout's own scorer comes first; `other_scorers` score the same responses. A multi-turn rollout scores
    each episode on its last turn.

    Returns:
        (1 + len(other_scorers) + len(ROW_FIELDS), len(rows)) float64 values in row order: each scorer's score,
        then `ROW_FIELDS`; and this rank's rollouts, scored by the rollout's scorer.
    """
    device = rollout.device
    values = torch.zeros(1 + len(other_scorers) + len(ROW_FIELDS), len(rows), dtype=torch.float64, device=device)
    mine = list(range(rank, len(rows), world_size))
    scored_chunks = []
    # Every rank runs the same number of chunks: under FSDP2 each generation and reward-model forward is a
    # collective. A rank that ran out of rows (its share is one row short, or empty) scores a stand-in
    # row and records nothing from it.
    chunks = math.ceil(math.ceil(len(rows) / world_size) / batch_size)
    for start in range(0, chunks * batch_size, batch_size):
        indices = mine[start:start + batch_size]
        chunk = [rows[index] for index in indices] or rows[:1]
        scored = rollout.collect(chunk)
        extra = [scorer(scored.batch, scored.prompts, scored.responses, [r.get("answer") for r in chunk])
                 for scorer in other_scorers]
        if not indices:
            continue
        scored_chunks.append(scored)
        calls = torch.tensor(scored.tool_calls or [(0, 0)] * len(indices), dtype=torch.float64)  # (B, 2)
        columns = [s.double().cpu() for s in (scored.scores, *extra)]
        columns += [scored.batch["action_mask"].sum(dim=1).double().cpu(), calls[:, 0], calls[:, 1]]
        values[:, indices] = torch.stack(columns).to(device)  # (K, B)
    return all_reduce_sum(values), scored_chunks


@torch.no_grad()
def mean_score(rollout: Rollout, rows: list[dict], other_scorers: Sequence[Scorer] = (), rank: int = 0,
               world_size: int = 1, batch_size: int = 64) -> tuple[list[float], list[ScoredRollout]]:
    """Mean score of `rollout`'s responses to `rows` under its scorer and each of `other_scorers` (`score_rows`,
    whose arguments it takes).

    Returns:
        One mean per scorer (over all ranks' rows), and this rank's rollouts scored by the rollout's scorer.
    """
    values, scored = score_rows(rollout, rows, other_scorers, rank, world_size, batch_size)
    return (values[:1 + len(other_scorers)].sum(dim=1) / max(len(rows), 1)).tolist(), scored


def tool_call_counts(calls: list[float], errors: list[float]) -> dict[str, float]:
    """Tool calls per episode, and the share of calls that were valid (parsed, a known tool, ran without error;
    0 when no call was made), from each episode's calls and failed calls."""
    made, failed = sum(calls), sum(errors)
    return {"tool_calls_per_episode": made / max(len(calls), 1),
            "valid_tool_call_fraction": (made - failed) / made if made else 0.0}


def judge(config: EvaluateConfig, candidate: dict[str, list[float]], reference: dict[str, list[float]],
          reference_name: str) -> GateDecision:
    """The gate's decision for the candidate against `reference_name` (`baseline`, `champion`), from each model's
    per-row values by name (docs/pipelines.md, "The gate").

    The primary metric is what the candidate was trained to raise: the reward model's score where there is one,
    else the checkable reward. Where a reward model is primary, the checkable reward (the reward-hacking guard)
    and the responses' length are guards; for agents, the share of episodes whose tool calls were all valid.
    """
    gate = config.gate

    def compare(metric: str, lower_is_better: bool = False) -> PairedComparison:
        return compare_paired(candidate[metric], reference[metric], confidence=gate.confidence, metric=metric,
                              lower_is_better=lower_is_better)

    primary = "rm_score" if config.reward.model_path is not None else "reward"
    guards = []
    if primary == "rm_score":
        if "reward" in candidate:
            guards.append(Guard(compare("reward"), gate.guard_tolerance))
        reference_length = sum(reference["response_tokens"]) / len(reference["response_tokens"])
        guards.append(Guard(compare("response_tokens", lower_is_better=True),
                            gate.max_length_growth * reference_length))
    if config.environment is not None:
        guards.append(Guard(compare("valid_tool_calls"), gate.guard_tolerance))
    return GateDecision(reference=reference_name, primary=compare(primary), min_effect=gate.min_effect,
                        confidence=gate.confidence, guards=tuple(guards))


def build_scorers(config: EvaluateConfig, device: torch.device) -> tuple[list[Scorer], list[str]]:
    """The scorers of an evaluation, with the metric name each one reports."""
    scorers, names = [], []
    if config.reward.function is not None:
        scorers.append(FunctionScorer(load_reward_function(config.reward.function)))
        names.append("reward")
    if config.reward.model_path is not None:
        reward_model = load_frozen(load_value_model, config.model, device, config.reward.model_path,
                                   key="reward.model_path")
        scorers.append(RewardModelScorer(reward_model))
        names.append("rm_score")
    return scorers, names


def build_evaluation_rollout(config: EvaluateConfig, path: str, key: str, device: torch.device, tokenizer: Any,
                             scorer: Scorer, agent: Agent | None) -> Rollout:
    """The rollout that samples the saved model at `path` with `rollout.engine`: `hf` on the loaded model, or an
    engine that loads `path` itself (`vllm`; the model is then never loaded as a torch module here). `auto` loads
    the model to choose (`batch_size` rows a call), and `build_rollout` drops it again where `vllm` wins."""
    def load_policy() -> torch.nn.Module | None:
        if config.rollout.engine == "vllm":
            return None
        return load_frozen(load_causal_lm, ModelConfig(path=path), device, key=key)

    # The model is handed over unnamed, so that `build_rollout` holds its only reference and can free it.
    return build_rollout(config.rollout, policy=load_policy(), tokenizer=tokenizer, generation=config.generation,
                         scorer=scorer, device=device, rows_per_call=config.batch_size,
                         setup=EngineSetup(path, seed=0), agent=agent, label=key)


def run_evaluation(config: EvaluateConfig) -> dict[str, float]:
    """Score the candidate (and the baseline, and the champion), judge the gate, and write the results to
    `output_dir`; returns the metrics."""
    check_output_directories(config)  # before the generation it would otherwise throw away
    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    prompts = load_rows(config.prompts_path, "prompt", skip_bad_rows=False).examples
    repeats = config.samples_per_prompt
    rows = [row for row in prompts for _ in range(repeats)]  # each prompt's samples side by side
    scorers, names = build_scorers(config, device)
    collector.resume()  # the models load one at a time below; the imports and the scorers are done
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict]] = {}
    per_row: dict[str, dict[str, list[float]]] = {}  # model prefix -> value name -> one value per row
    paths = {"": config.model.path, "baseline_": config.baseline_path, "champion_": config.champion_path}
    models = {prefix: path for prefix, path in paths.items() if path}
    tokenizers = {prefix: load_tokenizer(path) for prefix, path in models.items()}
    # Before any model loads: an environment's code tool proves its sandbox with a canary program here.
    agents = {prefix: build_agent(config.environment, tokenizers[prefix]) for prefix in models}
    for prefix, path in models.items():
        agent = agents[prefix]
        rollout = build_evaluation_rollout(config, path, MODEL_KEYS[prefix], device, tokenizers[prefix], scorers[0],
                                           agent)
        torch.manual_seed(config.seed)  # every model draws the same random numbers
        try:
            values, rollouts = score_rows(rollout, rows, scorers[1:], env.rank, env.world_size, config.batch_size)
        finally:
            rollout.close()  # one model's engine at a time
        per_sample = {name: row.tolist() for name, row in zip([*names, *ROW_FIELDS], values.cpu())}
        per_sample["valid_tool_calls"] = [float(errors == 0) for errors in per_sample["tool_errors"]]
        per_row[prefix] = {name: prompt_means(column, repeats) for name, column in per_sample.items()}
        means = [sum(per_row[prefix][name]) / max(len(prompts), 1) for name in names]
        metrics.update({f"{prefix}{name}": value for name, value in zip(names, means)})
        if agent is not None:  # multi-turn episodes: how the model used its tools
            counts = tool_call_counts(per_row[prefix]["tool_calls"], per_row[prefix]["tool_errors"])
            metrics.update({f"{prefix}{name}": value for name, value in counts.items()})
        samples[prefix or "candidate"] = [s for rollout in rollouts for s in rollout.samples(len(rollout.prompts))]
        logger.info("%s: %s", path, ", ".join(f"{n}={v:.4f}" for n, v in zip(names, means)))
        del rollout
    decisions = [judge(config, per_row[""], per_row[prefix], reference)
                 for prefix, reference in (("baseline_", "baseline"), ("champion_", "champion")) if prefix in per_row]
    if config.baseline_path:
        metrics["improvement"] = metrics[names[0]] - metrics[f"baseline_{names[0]}"]
    for decision in decisions:
        metrics.update(decision.metrics())
        logger.info("gate: %s", decision.reason)
    if env.is_main_process:
        write_results(config.output_dir, metrics, side_by_side(samples), decisions,
                      per_prompt_rows(prompts, per_row))
    return metrics


def prompt_means(values: list[float], repeats: int) -> list[float]:
    """Each prompt's mean over its `repeats` consecutive samples."""
    return [sum(values[start:start + repeats]) / repeats for start in range(0, len(values), repeats)]


def per_prompt_rows(rows: list[dict], per_row: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One record per held-out row: its prompt and each model's values, means over its samples (what the gate's
    statistics read)."""
    return [{"prompt": str(row["prompt"]),
             **{prefix.rstrip("_") or "candidate": {name: values[index] for name, values in named.items()}
                for prefix, named in per_row.items()}}
            for index, row in enumerate(rows)]


def side_by_side(samples: dict[str, list[dict]]) -> list[dict]:
    """The first prompts with each model's response and score, for the report (one sample of each prompt)."""
    rows, shown = [], set()
    for index, candidate in enumerate(samples["candidate"]):
        if len(rows) == SAMPLES_KEPT:
            break
        if candidate["prompt"] in shown:
            continue  # another sample of a prompt already shown
        shown.add(candidate["prompt"])
        row = {"prompt": candidate["prompt"], "response": candidate["response"], "score": candidate["score"]}
        for prefix in ("baseline_", "champion_"):
            if prefix in samples and index < len(samples[prefix]):
                other = samples[prefix][index]
                row |= {f"{prefix}response": other["response"], f"{prefix}score": other["score"]}
        rows.append(row)
    return rows


def write_results(output_dir: str, metrics: dict[str, float], samples: list[dict],
                  decisions: list[GateDecision] = (), per_prompt: list[dict] = ()) -> None:
    """`final_metrics.json`, `samples.jsonl`, `gate.json` (each decision and its reason, by reference) and
    `per_prompt.jsonl` (every row's values per model)."""
    gate = {d.reference: {"opens": d.opens, "reason": d.reason, "metric": d.primary.metric, "metrics": d.metrics()}
            for d in decisions}
    files = {"final_metrics.json": json.dumps(metrics, indent=2),
             "samples.jsonl": "".join(json.dumps(row) + "\n" for row in samples),
             "gate.json": json.dumps(gate, indent=2),
             "per_prompt.jsonl": "".join(json.dumps(row) + "\n" for row in per_prompt)}
    storage = get_storage(output_dir)
    for name, text in files.items():
        storage.write_bytes(join_uri(output_dir, name), text.encode())
    logger.info("evaluation written to %s", output_dir)
