"""Rows with the same prompt share its forward (`trainer.modeling.shared_prompts`): sampling draws what the plain
`generate` draws; the log-probs, the entropy and the gradient equal those of the plain forward, on one process and
on 2 DDP ranks; and the models where sharing would not be exact take the plain forward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.integration.services import free_port
from tests.trainer.algorithms.stand_ins import BigramLM
from trainer.algorithms.ppo import response_logps
from trainer.config import GenerationConfig
from trainer.modeling import shared_prompts
from trainer.modeling.models import enable_activation_checkpointing
from trainer.modeling.shared_prompts import prompt_groups, shares_prompts
from trainer.rollout import engines
from trainer.rollout.engines import HFGenerateEngine
from trainer.tiny.families import FAMILIES, build_family_config
from trainer.tiny.model import build_tiny_llama

DRIVER = Path(__file__).with_name("shared_prompts_driver.py")
REPOSITORY = Path(__file__).parents[3]


def grouped_batch(generations: int = 3, seed: int = 0, with_positions: bool = True) -> dict[str, torch.Tensor]:
    """3 left-padded prompts of 5, 3 and 6 tokens, `generations` right-padded responses each, rows shuffled."""
    generator = torch.Generator().manual_seed(seed)
    width, response = 6, 5
    prompts, masks = [], []
    for length in (5, 3, 6):
        prompts.append([0] * (width - length) + torch.randint(3, 40, (length,), generator=generator).tolist())
        masks.append([0] * (width - length) + [1] * length)
    rows = torch.randperm(3 * generations, generator=generator) % 3  # each prompt `generations` times, in any order
    lengths = torch.randint(1, response + 1, (len(rows),), generator=generator)
    responses = torch.randint(3, 40, (len(rows), response), generator=generator)
    response_mask = (torch.arange(response) < lengths[:, None]).long()
    attention_mask = torch.cat([torch.tensor(masks)[rows], response_mask], dim=1)
    batch = {"input_ids": torch.cat([torch.tensor(prompts)[rows], responses * response_mask], dim=1),
             "attention_mask": attention_mask, "action_mask": torch.cat([torch.zeros(len(rows), width).long(),
                                                                          response_mask], dim=1)}
    if with_positions:
        batch["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return batch


def plain_logps(model, batch, with_entropy=False):
    """`response_logps` with sharing turned off: every row through the whole forward, its prompt included."""
    original = shared_prompts.prompt_groups
    shared_prompts.prompt_groups = lambda *args: None
    try:
        return response_logps(model, batch, with_entropy=with_entropy)
    finally:
        shared_prompts.prompt_groups = original


def shared_calls(model) -> list[int]:
    """The batch size of each of the model's forwards, appended as they run (a shared call runs the distinct
    prompts first)."""
    sizes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: sizes.append(len(kwargs["input_ids"])),
                                    with_kwargs=True)
    return sizes


def test_rows_are_grouped_by_prompt_tokens_and_mask():
    ids = torch.tensor([[0, 5, 6, 9], [0, 5, 6, 8], [5, 5, 6, 9], [0, 5, 6, 7]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])  # row 3: same ids, token 0 real
    representative, group = prompt_groups(ids, mask, split=3)
    assert group[0] == group[1] and len({int(g) for g in group}) == 3
    assert torch.equal(ids[representative[group], :3], ids[:, :3])  # each row's group holds its own prompt
    assert prompt_groups(ids, mask, split=4) is None  # every row distinct: nothing to share


@pytest.mark.parametrize("with_positions", [True, False])
def test_shared_log_probs_entropy_and_gradient_equal_the_plain_forward(with_positions):
    model = build_tiny_llama(40, seed=1)
    batch = grouped_batch(with_positions=with_positions)
    sizes = shared_calls(model)
    logps, entropy = response_logps(model, batch, with_entropy=True)
    assert sizes == [3, 9]  # 3 distinct prompts once, then the 9 rows' responses
    (logps * batch["action_mask"]).sum().backward()
    shared_gradient = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    plain, plain_entropy = plain_logps(model, batch, with_entropy=True)
    (plain * batch["action_mask"]).sum().backward()
    assert sizes[2:] == [9]
    torch.testing.assert_close(logps, plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, plain_entropy, rtol=0, atol=1e-5)
    for shared, expected in zip(shared_gradient, (p.grad for p in model.parameters())):
        torch.testing.assert_close(shared, expected, rtol=1e-4, atol=1e-6)


def test_cache_rows_gathered_by_index_select_equal_batch_select_indices_and_their_gradient():
    # issue 49: `_select_cache_rows` gathers keys and values with index_select, whose backward is cheaper
    # than that of the indexing `batch_select_indices` does; values and gradients must not change.
    model = build_tiny_llama(40, seed=1)
    ids = torch.randint(3, 40, (3, 6), generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([2, 0, 1, 2, 0, 1])  # each of 3 prompts gathered twice, as a DPO pair's two rows are
    gathered = []
    for select in (shared_prompts._select_cache_rows, lambda cache, group: cache.batch_select_indices(group)):
        model.zero_grad()
        cache = model(input_ids=ids, use_cache=True).get(shared_prompts.cache_argument(model))
        select(cache, rows)
        weights = torch.arange(1.0, 7.0)[:, None, None, None]  # (6, 1, 1, 1): every row's gradient differs
        sum((weights * layer.keys + weights.flip(0) * layer.values).sum() for layer in cache.layers).backward()
        gathered.append(([layer.keys.detach() for layer in cache.layers], [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (keys, gradient), (expected_keys, expected_gradient) = gathered
    assert all(torch.equal(a, b) for a, b in zip(keys, expected_keys))
    assert len(gradient) == len(expected_gradient) > 0
    assert all(torch.equal(a, b) for a, b in zip(gradient, expected_gradient))  # two rows per prompt: same sums


def test_models_where_sharing_is_not_exact_take_the_plain_forward():
    from transformers import MistralConfig, MistralForCausalLM

    assert shares_prompts(build_tiny_llama(40))
    checkpointed = build_tiny_llama(40)
    enable_activation_checkpointing(checkpointed)  # turns the cache off in training
    windowed = MistralForCausalLM(MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=2, num_key_value_heads=1, sliding_window=4))
    wrapped = nn.Module()
    wrapped.module = build_tiny_llama(40)  # a wrapper other than DDP (ColossalAI's) may act around the forward
    for model in (checkpointed, windowed, wrapped, BigramLM([[1.0] * 4] * 4)):
        assert not shares_prompts(model), type(model).__name__


def test_two_ddp_ranks_reduce_the_gradient_of_the_shared_forward(tmp_path):
    # Each rank scores half the rows with the shared forward inside DDP; the gradient DDP averages over the ranks
    # must equal one process's gradient of the mean of both halves' sums through the plain forward.
    dump = tmp_path / "gradients.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(dump)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = torch.load(dump)
    for sizes in ranks["forward_sizes"]:  # each rank ran its distinct prompts (fewer than its 6 rows), then the rows
        assert len(sizes) == 2 and sizes[0] < 6 and sizes[1] == 6, sizes
    model = build_tiny_llama(40, seed=1)
    batch = grouped_batch(generations=4)
    for half in (slice(0, 6), slice(6, 12)):
        rows = {name: tensor[half] for name, tensor in batch.items()}
        (plain_logps(model, rows) * rows["action_mask"]).sum().div(2).backward()
    for rank in (0, 1):
        for reduced, expected in zip(ranks["gradients"][rank], (p.grad for p in model.parameters())):
            torch.testing.assert_close(reduced, expected, rtol=1e-4, atol=1e-6)


def test_sampling_from_the_shared_prefill_draws_what_the_plain_call_draws(monkeypatch):
    model = build_tiny_llama(40, seed=1)
    batch = grouped_batch()
    prompts, mask = batch["input_ids"][:, :6], batch["attention_mask"][:, :6]
    shapes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                    with_kwargs=True)
    engine = HFGenerateEngine(model)
    options = GenerationConfig(max_new_tokens=8, temperature=1.0)
    torch.manual_seed(3)
    shared = engine.generate(prompts, mask, options, stop_token_ids=[2], pad_token_id=0).ids
    assert shapes[:2] == [(3, 5), (9, 1)]  # the distinct prompts but their last token, then the last token of each row
    monkeypatch.setattr(engines, "prefilled_prompts", lambda *args: {})
    first_plain_call = len(shapes)
    torch.manual_seed(3)
    plain = engine.generate(prompts, mask, options, stop_token_ids=[2], pad_token_id=0).ids
    assert shapes[first_plain_call] == (9, 6)  # generate's own prefill: every row's whole prompt
    assert torch.equal(shared, plain)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_shares_exactly_or_not_at_all(family):
    # The families users train (docs/models.md): those with full attention in every layer share, with the plain
    # forward's log-probs; those with a sliding window (cut shorter than these rows) take the plain forward.
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_family_config(family, 40))
    windowed = "sliding_window" in FAMILIES[family][1]  # Mistral, Gemma3, Phi3
    assert shares_prompts(model) is not windowed
    batch = grouped_batch()
    sizes = shared_calls(model)
    torch.testing.assert_close(response_logps(model, batch), plain_logps(model, batch), rtol=0, atol=1e-5)
    assert sizes[0] == (9 if windowed else 3)
