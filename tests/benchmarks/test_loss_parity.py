"""The loss-parity benchmark's own logic: every variant is a valid alignflow config, both systems get the same
fixed completions whatever order their prompts come in, and the comparison measures what it says (the runs
themselves need TRL: `benchmarks/loss_parity.py`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from trainer.tiny.model import build_tokenizer

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "loss_parity.py"
spec = importlib.util.spec_from_file_location("loss_parity", SCRIPT)
loss_parity = importlib.util.module_from_spec(spec)
sys.modules["loss_parity"] = loss_parity
spec.loader.exec_module(loss_parity)


@pytest.mark.parametrize("name", loss_parity.VARIANTS)
def test_every_variant_is_a_valid_alignflow_config(name, tmp_path):
    variant = loss_parity.VARIANTS[name]
    files = {key: tmp_path / key for key in ("model", "preference", "unpaired", "prompts")}
    config = loss_parity.alignflow_config(variant, files, tmp_path / "run", steps=4)
    assert config.train.micro_batch_size == loss_parity.BATCH and config.train.mixed_precision == "no"
    if variant.family in ("grpo", "rloo"):
        epochs = config.grpo.num_update_epochs
        assert config.grpo.num_episodes * epochs == 4 and config.grpo.mini_batch_size == loss_parity.BATCH
    else:
        assert config.train.max_steps == 4 and not config.train.group_by_length  # TRL's batch order


def test_fixed_completions_give_every_group_a_right_and_a_wrong_answer_whatever_the_prompt_order():
    tokenizer = build_tokenizer()
    prompts = ["3+4="] * 4 + ["1+1="] * 4
    rows = loss_parity.fixed_completions(prompts, step=3, tokenizer=tokenizer)
    swapped = loss_parity.fixed_completions(prompts[4:] + prompts[:4], step=3, tokenizer=tokenizer)
    assert rows == swapped[4:] + swapped[:4]  # the same rows for each prompt, in either order
    assert tokenizer.decode(rows[0]) == "7" + tokenizer.eos_token and tokenizer.decode(rows[1]) != tokenizer.decode(rows[0])
    for ids in rows:  # ends with EOS, or is a truncated response of exactly NEW_TOKENS ids
        assert ids[-1] == tokenizer.eos_token_id or len(ids) == loss_parity.NEW_TOKENS


def test_compare_reports_the_largest_loss_gap_and_relative_gradient_gap():
    mine = [{"loss": 1.0, "grad_norm": 2.0}, {"loss": 0.5, "grad_norm": 0.0}]
    theirs = [{"loss": 1.1, "grad_norm": 2.2}, {"loss": 0.5, "grad_norm": 1e-9}]
    result = loss_parity.compare(mine, theirs)
    assert result["steps"] == 2
    assert result["max_loss_diff"] == pytest.approx(0.1)
    assert result["max_grad_norm_rel_diff"] == pytest.approx(0.2 / 2.2)  # a zero step against 1e-9 counts as equal


def test_alignflow_rollouts_get_the_fixed_completions_through_the_engine_interface():
    import torch

    from trainer.config import GenerationConfig
    from trainer.rollout.engines import HFGenerateEngine
    from trainer.rollout.single_turn import generate
    from trainer.tiny.model import build_tiny_llama

    tokenizer = build_tokenizer()
    prompts = ["3+4=", "3+4=", "1+1=", "1+1="]
    expected = loss_parity.fixed_completions(prompts, step=0, tokenizer=tokenizer)
    with loss_parity.alignflow_fixed_generation(tokenizer):
        batch = generate(HFGenerateEngine(build_tiny_llama(len(tokenizer))), tokenizer,
                         [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
                         GenerationConfig(max_new_tokens=loss_parity.NEW_TOKENS), torch.device("cpu"))
    responses = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["action_mask"])]
    assert responses == expected
