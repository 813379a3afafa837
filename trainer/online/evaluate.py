"""Scoring a policy's responses on held-out prompts: the online stages' evaluation and `python -m trainer evaluate`.

`mean_score` is the one evaluation loop: prompts split across ranks, responses generated and
scored by `generate_and_score`, the sum all-reduced. Answers are sampled by the config's
`rollout.engine` (`hf` by default; `vllm` loads each saved model into its own engine). `run_evaluation` is what the pipelines'
`evaluate_model` component launches as its own job (so generation runs on a GPU node): it scores
a candidate, a baseline and, when given, the registry's champion with the checkable reward
function and, optionally, a reward model, and writes `final_metrics.json` (`reward`,
`baseline_reward`, `champion_reward`, `improvement`, `rm_score`, `baseline_rm_score`,
`champion_rm_score`; with an `environment`, each model's `tool_calls_per_episode` and
`valid_tool_call_fraction` too) and `samples.jsonl` (the models' answers side by side).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import torch
from torch import nn

from trainer.agents.setup import build_agent_rollout
from trainer.config import EvaluateConfig, GenerationConfig, ModelConfig
from trainer.data.dataset import load_rows
from trainer.lifecycle import collector
from trainer.lifecycle.resume import check_output_directories
from trainer.modeling.models import load_causal_lm, load_frozen, load_tokenizer, load_value_model
from trainer.online.engine_choice import choose_engine
from trainer.online.engine_registry import build_rollout_engine
from trainer.online.engines import EngineSetup, RolloutEngine
from trainer.online.reward_sources import FunctionScorer, RewardModelScorer, load_reward_function
from trainer.online.rollout import ScoredRollout, generate_and_score
from trainer.runtime import all_reduce_sum, init_process_group, pick_device, read_distributed_env
from trainer.storage import get_storage, join_uri

logger = logging.getLogger(__name__)
SAMPLES_KEPT = 10
# Metric-name prefix of each model an evaluation scores, with the config key that names it.
MODEL_KEYS = {"": "model.path", "baseline_": "baseline_path", "champion_": "champion_path"}


@torch.no_grad()
def mean_score(model: nn.Module | RolloutEngine, tokenizer: Any, rows: list[dict], generation: GenerationConfig,
               device: torch.device, scorers: list[Any], rank: int = 0, world_size: int = 1,
               batch_size: int = 64, agent: Any = None) -> tuple[list[float], list[ScoredRollout]]:
    """Mean score of `model`'s responses to `rows` under each scorer; this rank's rows are `rows[rank::world_size]`.

    `model` is a model (sampled by the default `hf` engine) or a training run's rollout engine. With an
    `agent` (`trainer.agents.rollout.AgentRollout`) each row is a multi-turn episode, scored on its last turn.

    Returns:
        One mean per scorer (over all ranks' rows), and this rank's rollouts scored by the first scorer.
    """
    mine = rows[rank::world_size]
    totals = torch.zeros(len(scorers) + 1, dtype=torch.float64, device=device)  # (scorers..., count)
    rollouts = []
    # Every rank runs the same number of chunks: under FSDP2 each generation and reward-model forward is a
    # collective. A rank that ran out of rows (its share is one row short, or empty) scores a stand-in
    # row and counts nothing from it.
    chunks = math.ceil(math.ceil(len(rows) / world_size) / batch_size)
    for start in range(0, chunks * batch_size, batch_size):
        chunk = mine[start:start + batch_size]
        counted = bool(chunk)
        chunk = chunk or rows[:1]
        sample_and_score = agent.generate_and_score if agent is not None else generate_and_score
        rollout = sample_and_score(model, tokenizer, chunk, generation, device, scorers[0])
        extra = [scorer(rollout.batch, rollout.prompts, rollout.responses, [r.get("answer") for r in chunk])
                 for scorer in scorers[1:]]
        if not counted:
            continue
        rollouts.append(rollout)
        totals += torch.stack([s.double().sum() for s in (rollout.scores, *extra)]
                              + [torch.tensor(float(len(chunk)), dtype=torch.float64, device=device)])
    *sums, count = all_reduce_sum(totals).tolist()
    return [total / max(count, 1) for total in sums], rollouts


def tool_call_counts(rollouts: list[ScoredRollout], num_rows: int, device: torch.device) -> dict[str, float]:
    """Over all ranks' episodes: tool calls per episode, and the share of calls that were valid (parsed, a known
    tool, ran without error; 0 when no call was made)."""
    calls = valid = 0.0
    for rollout in rollouts:  # each rollout's `agent/*` metrics are means over its own episodes
        made = rollout.metrics["agent/tool_calls_per_episode"] * len(rollout.prompts)
        calls += made
        valid += rollout.metrics["agent/valid_tool_call_fraction"] * made
    valid, calls = all_reduce_sum(torch.tensor([valid, calls], dtype=torch.float64, device=device)).tolist()
    return {"tool_calls_per_episode": calls / max(num_rows, 1),
            "valid_tool_call_fraction": valid / calls if calls else 0.0}


def build_scorers(config: EvaluateConfig, device: torch.device) -> tuple[list[Any], list[str]]:
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


def build_evaluation_engine(config: EvaluateConfig, path: str, key: str, device: torch.device) -> RolloutEngine:
    """The `rollout.engine` that samples the saved model at `path`: `hf` on the loaded model, or an engine
    that loads `path` itself (`vllm`; the model is then never loaded as a torch module here). `auto` loads the
    model to choose (`engine_choice`, `batch_size` rows a call) and drops it again where `vllm` wins."""
    rollout = config.rollout
    if rollout.engine != "vllm":
        model = load_frozen(load_causal_lm, ModelConfig(path=path), device, key=key)
        engine, reason = choose_engine(rollout, model, config.batch_size, device)
        if rollout.engine == "auto":
            logger.info("rollout.engine auto for %s: %s, as %s", key, engine, reason)
        if engine == "hf":
            return build_rollout_engine(rollout.model_copy(update={"engine": "hf"}), model)
        del model
    return build_rollout_engine(rollout.model_copy(update={"engine": "vllm"}), None, EngineSetup(path, seed=0))


def run_evaluation(config: EvaluateConfig) -> dict[str, float]:
    """Score the candidate (and the baseline) and write the results to `output_dir`; returns the metrics."""
    check_output_directories(config)  # before the generation it would otherwise throw away
    env = read_distributed_env()
    device = pick_device(env)
    init_process_group(env, device)
    rows = load_rows(config.prompts_path, "prompt", skip_bad_rows=False).examples
    scorers, names = build_scorers(config, device)
    collector.resume()  # the models load one at a time below; the imports and the scorers are done
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict]] = {}
    paths = {"": config.model.path, "baseline_": config.baseline_path, "champion_": config.champion_path}
    models = {prefix: path for prefix, path in paths.items() if path}
    for prefix, path in models.items():
        tokenizer = load_tokenizer(path)
        engine = build_evaluation_engine(config, path, MODEL_KEYS[prefix], device)
        agent = build_agent_rollout(config.environment, tokenizer)
        try:
            means, rollouts = mean_score(engine, tokenizer, rows, config.generation, device, scorers, env.rank,
                                         env.world_size, config.batch_size, agent=agent)
        finally:
            engine.close()  # one model's engine at a time
        metrics.update({f"{prefix}{name}": value for name, value in zip(names, means)})
        if agent is not None:  # multi-turn episodes: how the model used its tools
            counts = tool_call_counts(rollouts, len(rows), device)
            metrics.update({f"{prefix}{name}": value for name, value in counts.items()})
        samples[prefix or "candidate"] = [s for rollout in rollouts for s in rollout.samples(len(rollout.prompts))]
        logger.info("%s: %s", path, ", ".join(f"{n}={v:.4f}" for n, v in zip(names, means)))
        del engine
    if config.baseline_path:
        metrics["improvement"] = metrics[names[0]] - metrics[f"baseline_{names[0]}"]
    if env.is_main_process:
        write_results(config.output_dir, metrics, side_by_side(samples))
    return metrics


def side_by_side(samples: dict[str, list[dict]]) -> list[dict]:
    """The first prompts with each model's response and score, for the report."""
    rows = []
    for index, candidate in enumerate(samples["candidate"][:SAMPLES_KEPT]):
        row = {"prompt": candidate["prompt"], "response": candidate["response"], "score": candidate["score"]}
        for prefix in ("baseline_", "champion_"):
            if prefix in samples and index < len(samples[prefix]):
                other = samples[prefix][index]
                row |= {f"{prefix}response": other["response"], f"{prefix}score": other["score"]}
        rows.append(row)
    return rows


def write_results(output_dir: str, metrics: dict[str, float], samples: list[dict]) -> None:
    files = {"final_metrics.json": json.dumps(metrics, indent=2),
             "samples.jsonl": "".join(json.dumps(row) + "\n" for row in samples)}
    storage = get_storage(output_dir)
    for name, text in files.items():
        storage.write_bytes(join_uri(output_dir, name), text.encode())
    logger.info("evaluation written to %s", output_dir)
