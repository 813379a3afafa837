"""Each supervised stage learns the tiny addition task on a CPU in seconds.

SFT (the `sft_model` fixture, 60 epochs) teaches the format and most sums; the reward model then
separates correct from near-miss answers on held-out pairs; DPO widens the log-prob margin between
chosen and rejected answers on held-out pairs.
"""

from __future__ import annotations

import json

import torch

from tests.conftest import make_config
from trainer.algorithms.common import sequence_logps
from trainer.data.collate import pad_preference
from trainer.data.dataset import load_preference_dataset
from trainer.modeling.models import load_tokenizer
from trainer.supervised.stages import run_stage


def read_metrics(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_sft_loss_falls_clearly(sft_model):
    evals = [m["eval/loss"] for m in read_metrics(sft_model.parent) if "eval/loss" in m]
    assert evals[-1] < 0.25 * evals[0], evals


def test_reward_model_ranks_held_out_pairs(tmp_path, sft_model, task_files):
    config = make_config("rm", tmp_path / "rm", sft_model, task_files["pref_train"], task_files["pref_eval"],
                         optimizer={"lr": 1e-3, "warmup_steps": 5}, train={"max_epochs": 15, "micro_batch_size": 16})
    result = run_stage(config)
    # A stage stopped early (a signal) returns its last step's metrics, without evaluation: say so, not KeyError.
    assert result.stopped is None, f"the RM stage stopped before its end: {result.stopped}"
    metrics = result.metrics
    assert metrics["eval/accuracy"] >= 0.9, metrics
    assert metrics["eval/rewards/margins"] > 0


@torch.no_grad()
def held_out_margin(model_dir, pairs_file) -> float:
    """Mean of log p(chosen) - log p(rejected) over held-out pairs, for the model in `model_dir`."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    examples = load_preference_dataset(str(pairs_file), tokenizer, 32, False).examples
    batch = pad_preference(examples, tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    chosen, rejected = sequence_logps(logits, batch["labels"])[0].chunk(2)
    return float((chosen - rejected).mean())


def test_dpo_raises_held_out_margin(tmp_path, sft_model, task_files):
    config = make_config("dpo", tmp_path / "dpo", sft_model, task_files["pref_train"], task_files["pref_eval"],
                         optimizer={"lr": 5e-4, "warmup_steps": 5}, train={"max_epochs": 2, "micro_batch_size": 16},
                         dpo={"beta": 0.1})
    run_stage(config)
    before = held_out_margin(sft_model, task_files["pref_eval"])
    after = held_out_margin(tmp_path / "dpo" / "model", task_files["pref_eval"])
    assert after > before + 1.0, (before, after)
