"""`python -m trainer evaluate`: greedy answers of a candidate and a baseline, scored against the checker."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from trainer.__main__ import main
from trainer.rollout.engines import HFGenerateEngine
from trainer.tiny.task import check_answer


def evaluate(tmp_path, candidate, baseline, prompts, sampling: dict | None = None, **reward) -> dict:
    config = {"output_dir": str(tmp_path / "out"), "model": {"path": str(candidate)}, "baseline_path": str(baseline),
              "prompts_path": str(prompts), "generation": {"max_new_tokens": 4, "temperature": 0.0},
              "reward": reward or {"function": "trainer.tiny.task:reward"}, **(sampling or {})}
    (tmp_path / "evaluate.yaml").write_text(yaml.safe_dump(config))
    assert main(["evaluate", "--config", str(tmp_path / "evaluate.yaml")]) == 0
    return json.loads((tmp_path / "out" / "final_metrics.json").read_text())


def test_reward_is_the_fraction_of_checked_answers_and_improvement_the_difference(tmp_path, sft_model, tiny_model,
                                                                                  task_files):
    metrics = evaluate(tmp_path, sft_model, tiny_model, task_files["eval_prompts"])
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in task_files["eval_prompts"].read_text().splitlines()]
    answers = {row["prompt"]: row["answer"] for row in rows}
    # Each kept sample's score is the checker's verdict on the response shown beside it.
    for sample in samples:
        assert sample["score"] == check_answer(sample["response"], answers[sample["prompt"]])
        assert sample["baseline_score"] == check_answer(sample["baseline_response"], answers[sample["prompt"]])
    assert 0.0 <= metrics["baseline_reward"] < metrics["reward"] <= 1.0  # SFT beats the untrained model
    assert metrics["improvement"] == metrics["reward"] - metrics["baseline_reward"]
    assert metrics["reward"] * len(rows) == round(metrics["reward"] * len(rows))  # a count of right answers
    # The gate reads every prompt's pair of scores, written beside the means they average to.
    from trainer.online.paired_gate import compare_paired

    per_prompt = [json.loads(line) for line in (tmp_path / "out" / "per_prompt.jsonl").read_text().splitlines()]
    assert [record["prompt"] for record in per_prompt] == [row["prompt"] for row in rows]
    ours, theirs = ([record[model]["reward"] for record in per_prompt] for model in ("candidate", "baseline"))
    assert sum(ours) / len(rows) == pytest.approx(metrics["reward"])
    assert sum(theirs) / len(rows) == pytest.approx(metrics["baseline_reward"])
    expected = compare_paired(ours, theirs, confidence=0.95)
    assert metrics["gate/lower_bound"] == pytest.approx(expected.lower_bound)
    assert metrics["gate/opens"] == float(expected.lower_bound >= 0.05) and metrics["gate/n"] == len(rows)
    gate = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert gate["baseline"]["opens"] == bool(metrics["gate/opens"]) and "reward" in gate["baseline"]["reason"]
    assert set(gate) == {"baseline"}  # no champion was given


def test_sampled_answers_score_each_prompt_by_their_mean_with_the_same_draws_for_every_model(tmp_path, sft_model,
                                                                                          task_files):
    """16 answers a prompt at temperature 1: each prompt's score is a mean of 16 verdicts, and the same model as
    candidate and baseline draws the same answers (the seed is set again per model), so they tie on every prompt."""
    sampling = {"samples_per_prompt": 16, "generation": {"max_new_tokens": 4, "temperature": 1.0}}
    metrics = evaluate(tmp_path, sft_model, sft_model, task_files["eval_prompts"], sampling)
    rows = [json.loads(line) for line in task_files["eval_prompts"].read_text().splitlines()]
    per_prompt = [json.loads(line) for line in (tmp_path / "out" / "per_prompt.jsonl").read_text().splitlines()]
    assert [record["prompt"] for record in per_prompt] == [row["prompt"] for row in rows]  # one record a prompt
    ours = [record["candidate"]["reward"] for record in per_prompt]
    assert ours == [record["baseline"]["reward"] for record in per_prompt]
    assert all(value * 16 == round(value * 16) for value in ours)
    assert any(0 < value < 1 for value in ours)  # sampled: some prompts answered right only some of the time
    assert metrics["reward"] == pytest.approx(sum(ours) / len(rows)) and metrics["gate/difference"] == 0.0
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len({sample["prompt"] for sample in samples}) == len(samples)  # the report shows each prompt once
    (tmp_path / "again").mkdir()
    rerun = evaluate(tmp_path / "again", sft_model, sft_model, task_files["eval_prompts"], sampling)
    assert rerun["reward"] == metrics["reward"]


def test_several_answers_a_prompt_need_a_temperature(tmp_path, sft_model, task_files):
    from trainer.config import EvaluateConfig

    with pytest.raises(ValueError, match="samples_per_prompt is 4 but generation.temperature is 0"):
        EvaluateConfig.model_validate({"output_dir": str(tmp_path), "model": {"path": str(sft_model)},
                                       "prompts_path": str(task_files["eval_prompts"]),
                                       "reward": {"function": "tiny_addition"}, "samples_per_prompt": 4})


def test_a_reward_model_score_is_reported_beside_the_checker(tmp_path, sft_model, tiny_model, task_files):
    from tests.trainer.modeling.test_value_heads import sequence_classifier

    sequence_classifier(tiny_model, tmp_path / "rm")  # a reward model needs a trained head (random would be noise)
    metrics = evaluate(tmp_path, sft_model, tiny_model, task_files["eval_prompts"],
                       function="trainer.tiny.task:reward", model_path=str(tmp_path / "rm"))
    assert {"reward", "baseline_reward", "rm_score", "baseline_rm_score", "improvement"} <= set(metrics)
    # With a reward model the gate judges its score; the checker's reward and the length are guards.
    gate = json.loads((tmp_path / "out" / "gate.json").read_text())["baseline"]
    assert "rm_score" in gate["reason"].split(":")[1]
    assert {"gate/guard/reward/holds", "gate/guard/response_tokens/holds"} <= set(metrics)
    per_prompt = [json.loads(line) for line in (tmp_path / "out" / "per_prompt.jsonl").read_text().splitlines()]
    assert all(1 <= record["candidate"]["response_tokens"] <= 4 for record in per_prompt)  # max_new_tokens 4


class CountingEngine(HFGenerateEngine):
    """The default `hf` engine, counting its generate calls (each one is a collective under FSDP2)."""

    calls = 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return super().generate(*args, **kwargs)


def test_every_rank_generates_as_many_chunks_and_counts_only_its_own_rows(tiny_model, task_files):
    from trainer.config import GenerationConfig, ModelConfig, RolloutConfig
    from trainer.modeling.models import load_causal_lm, load_tokenizer
    from trainer.online.evaluate import mean_score
    from trainer.rewards.functions import FunctionScorer, load_reward_function
    from trainer.rollout.single_turn import SingleTurnRollout

    model, tokenizer = load_causal_lm(ModelConfig(path=str(tiny_model))), load_tokenizer(str(tiny_model))
    rows = [json.loads(line) for line in task_files["eval_prompts"].read_text().splitlines()][:5]
    generation, scorer = GenerationConfig(max_new_tokens=2, temperature=0.0), FunctionScorer(load_reward_function("trainer.tiny.task:reward"))
    # 5 rows on 2 ranks in chunks of 2: rank 0 holds 3 rows (2 chunks), rank 1 holds 2 (1 chunk of its own).
    # With rank 1 running one chunk fewer, a sharded actor's second generation would wait forever.
    results = []
    for rank in range(2):
        engine = CountingEngine(model)
        rollout = SingleTurnRollout(engine, tokenizer=tokenizer, generation=generation, device=torch.device("cpu"),
                                    scorer=scorer, settings=RolloutConfig())
        means, rollouts = mean_score(rollout, rows, rank=rank, world_size=2, batch_size=2)
        results.append((engine.calls, sum(len(r.prompts) for r in rollouts), means))
    assert [calls for calls, _, _ in results] == [2, 2]
    assert [counted for _, counted, _ in results] == [3, 2]  # the stand-in row is neither kept nor counted
