"""The family matrix: tiny models of the causal LM families users train, through every stage and FSDP2.

Each family of `trainer.tiny.families` (Llama tied and untied, Qwen2, Qwen3, Mistral, Gemma3, Phi3,
GPT-2, GPT-NeoX) goes through SFT with packing, the reward model, DPO and one GRPO episode in this
process, and through FSDP2 on 2 gloo ranks (one torchrun for all families): the sharded load equals a
whole load and SFT resumed from its DCP checkpoint ends where the one-process run ends. Exports reload
with `AutoModelForCausalLM` (or as a reward model) equal to the trained weights. Packed rows give the
logits of padded ones (SFT's packing under `sdpa`, pair packing's variable-length attention, with
sequences longer than the sliding windows), and the lean activations apply to the families docs/models.md
names and leave gradients as Hugging Face's modules give them.

Cost is kept low: 2-layer width-32 models, 16 SFT rows (2 steps), 8 preference pairs (1 step), one
GRPO episode of 4 responses; one SFT run per family serves both its own test and the FSDP2 comparison.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import make_config, stage_dict
from tests.integration.services import free_port
from trainer.tiny.families import FAMILIES, write_family_model
from trainer.tiny.task import preference_rows, prompt_rows, sft_rows, write_jsonl

DRIVER = Path(__file__).with_name("families_fsdp2_driver.py")
REPOSITORY = Path(__file__).parents[2]
# docs/models.md ("Model families") names these; the rest keep Hugging Face's modules.
LEAN_FAMILIES = {"llama", "llama-tied", "qwen2", "qwen3", "mistral"}
# Width-32 models gain nothing from a second thread, and on a busy machine its synchronisation costs
# more than the step (AdamW's fused kernel: ~1.5 ms on one thread, up to 165 ms on two).
ONE_THREAD = {"num_threads": 1}


@pytest.fixture(scope="module", autouse=True)
def keep_thread_count():
    """The stages set torch's process-wide thread count; the tests after these get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def family_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: write_family_model(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def family_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-data")
    return {"sft": write_jsonl(sft_rows()[:16], root / "sft.jsonl"),
            "preference": write_jsonl(preference_rows(1, seed=0)[:8], root / "preference.jsonl"),
            "prompts": write_jsonl(prompt_rows()[:2], root / "prompts.jsonl")}


def sft_settings(micro_batch_size: int, plugin: str) -> dict:
    """Global batch 8 either way (8 x 1 process or 4 x 2 ranks): 2 optimizer steps on 16 rows."""
    return {"train": {"micro_batch_size": micro_batch_size, **ONE_THREAD}, "sft": {"packing": True},
            "parallel": {"plugin": plugin}}


class StageRuns:
    """Each family's one-process SFT and RM runs, made once and shared by the tests that need them."""

    def __init__(self, root: Path, models: dict[str, Path], data: dict[str, Path]) -> None:
        self.root, self.models, self.data, self.done = root, models, data, {}

    def run(self, stage: str, family: str):
        from trainer.supervised.stages import run_stage

        if (stage, family) not in self.done:
            settings = sft_settings(8, "single") if stage == "sft" else {"train": {"micro_batch_size": 8, **ONE_THREAD}}
            data = self.data["sft" if stage == "sft" else "preference"]
            config = make_config(stage, self.root / family / stage, self.models[family], data, **settings)
            self.done[stage, family] = (config, run_stage(config))
        return self.done[stage, family]


@pytest.fixture(scope="module")
def stage_runs(tmp_path_factory, family_models, family_data) -> StageRuns:
    return StageRuns(tmp_path_factory.mktemp("family-runs"), family_models, family_data)


def initial_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def assert_reloads_equal(export: Path, trained: dict[str, torch.Tensor]) -> None:
    """The exported directory loads with `AutoModelForCausalLM` and holds exactly the trained weights."""
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(export).state_dict()
    assert reloaded.keys() == trained.keys()
    for name, tensor in trained.items():
        assert torch.equal(reloaded[name], tensor), name


def assert_moved(trained: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> None:
    assert any(not torch.equal(tensor, initial[name]) for name, tensor in trained.items())


# -- the stages, one process ------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_with_packing_trains_and_its_export_reloads(family, stage_runs, family_models):
    config, result = stage_runs.run("sft", family)
    trained = {name: tensor.detach() for name, tensor in result.model.state_dict().items()}
    assert config.sft.packing is True
    assert result.metrics["global_step"] == 2 and math.isfinite(result.metrics["loss"])
    assert_moved(trained, initial_weights(family_models[family]))
    assert_reloads_equal(Path(config.output_dir) / "model", trained)


@pytest.mark.parametrize("family", FAMILIES)
def test_reward_model_trains_and_reloads_with_its_head(family, stage_runs):
    from trainer.config import ModelConfig
    from trainer.modeling.models import load_value_model

    config, result = stage_runs.run("rm", family)
    assert config.rm.packing is True
    trained = {name: tensor.detach() for name, tensor in result.model.state_dict().items()}
    reloaded = load_value_model(ModelConfig(path=str(Path(config.output_dir) / "model")), key="reward.model_path")
    assert reloaded.state_dict().keys() == trained.keys()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert 0.0 <= result.metrics["accuracy"] <= 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_dpo_starts_at_log_two_and_its_export_reloads(family, tmp_path, family_models, family_data):
    from trainer.supervised.stages import run_stage

    config = make_config("dpo", tmp_path, family_models[family], family_data["preference"],
                         train={"micro_batch_size": 8, "log_interval": 1, **ONE_THREAD}, dpo={"packing": True})
    result = run_stage(config)
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    # Before the first update the policy is its reference: every log-ratio is 0 and the loss is log 2.
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    trained = {name: tensor.detach() for name, tensor in result.model.state_dict().items()}
    assert_moved(trained, initial_weights(family_models[family]))
    assert_reloads_equal(tmp_path / "model", trained)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_grpo_episode_scored_by_the_familys_reward_model_moves_the_policy(family, tmp_path, stage_runs,
                                                                              family_models, family_data):
    from trainer.online.stages import run_online_stage

    reward_model = Path(stage_runs.run("rm", family)[0].output_dir) / "model"
    config = make_config("grpo", tmp_path, family_models[family], family_data["prompts"],
                         optimizer={"lr": 1e-3, "scheduler": "constant"}, train={"micro_batch_size": 4, **ONE_THREAD},
                         generation={"max_new_tokens": 6}, reward={"model_path": str(reward_model)},
                         grpo={"num_episodes": 1, "rollout_batch_size": 2, "num_generations": 2, "mini_batch_size": 4})
    result = run_online_stage(config)
    trained = {name: tensor.detach() for name, tensor in result.actor.state_dict().items()}
    assert_moved(trained, initial_weights(family_models[family]))  # the reward model told responses apart
    assert_reloads_equal(tmp_path / "model", trained)


# -- FSDP2 on 2 ranks, every family in one torchrun ---------------------------------------------


def run_families_under_fsdp2(work: Path, stage_runs: StageRuns, families: list[str]) -> str:
    """The driver's torchrun for `families`; returns its log."""
    import shutil

    for family in families:
        (work / family).mkdir()
        config = stage_dict("sft", work / family / "output", stage_runs.models[family], stage_runs.data["sft"],
                            **sft_settings(4, "fsdp2"))
        (work / family / "sft.yaml").write_text(yaml.safe_dump(config))
        shutil.copytree(Path(stage_runs.run("rm", family)[0].output_dir) / "model", work / family / "reward-model")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(DRIVER), str(work), *families]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout + done.stderr


def assert_equal_states(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor], what: str,
                        names: list[str] | None = None) -> None:
    """Bit for bit: the same bytes of the same files, read whole or in slices."""
    assert left.keys() == right.keys(), what
    for name in names if names is not None else right:
        assert torch.equal(left[name], right[name]), f"{what} {name}"


# In `make test`, the families whose checkpoints load differently (GPT-NeoX's renamed head, GPT-2's
# `transformer.` prefix and Conv1D layers, Gemma3's embedding scale and tied head, untied Llama); the
# Llama-shaped rest (names as Llama's) only with `-m slow`: every family adds about 1.5 s to the launch.
FSDP2_GROUPS = [pytest.param(["llama", "gpt2", "gemma3", "gpt-neox"], id="distinct-checkpoints"),
                pytest.param(["llama-tied", "qwen2", "qwen3", "mistral", "phi3"], id="llama-shaped",
                             marks=pytest.mark.slow)]


@pytest.mark.parametrize("families", FSDP2_GROUPS)
def test_every_family_loads_into_fsdp2_shards_and_resumes_from_dcp(families, tmp_path, stage_runs):
    assert sorted(sum((group.values[0] for group in FSDP2_GROUPS), [])) == sorted(FAMILIES)
    log = run_families_under_fsdp2(tmp_path, stage_runs, families)
    # Every model was read into shards (causal LM, reference, reward model, critic, two SFT runs), none whole.
    assert "loads it whole" not in log
    assert len(re.findall(r"loaded \S+ into shards", log)) == 6 * len(families)
    for family in families:
        loads = torch.load(tmp_path / family / "loads.pt")
        # Each parameter came from the tensor from_pretrained reads it from, each rank holding about half.
        assert_equal_states(loads["lm_sharded"], loads["lm_whole"], f"{family} causal LM")
        assert_equal_states(loads["reference_sharded"], loads["lm_whole"], f"{family} reference")
        assert not loads["reference_requires_grad"]
        for name in ("sharded", "reference"):  # buffers built in __init__ (rotary, embedding scales) survived
            torch.testing.assert_close(loads["lm_logits"][name], loads["lm_logits"]["whole"], rtol=1e-5, atol=1e-5)
        assert sum(loads["shard_numel"]) == loads["full_numel"], family  # a tied head counted once
        assert max(loads["shard_numel"]) <= 0.6 * loads["full_numel"], family
        # The reward model's backbone in shards and its trained head (not a fresh one); a critic's backbone.
        assert_equal_states(loads["reward_sharded"], loads["reward_whole"], f"{family} reward model")
        trained_head = stage_runs.run("rm", family)[1].model.head.weight.detach()
        assert torch.equal(loads["reward_whole"]["head.weight"], trained_head), family
        torch.testing.assert_close(loads["reward_outputs"]["sharded"], loads["reward_outputs"]["whole"],
                                   rtol=1e-5, atol=1e-5)
        backbone = [name for name in loads["critic_whole"] if name.startswith("backbone.")]
        assert_equal_states(loads["critic_sharded"], loads["critic_whole"], f"{family} critic", backbone)
        # SFT stopped after step 1, resumed from its shards, and ended where one process ends.
        output = tmp_path / family / "output"
        assert re.search(rf"resumed from {re.escape(str(output))}\S*step-00000001", log), family
        single = stage_runs.run("sft", family)[1].model.state_dict()
        assert loads["sft"].keys() == single.keys(), family
        for name, tensor in single.items():
            torch.testing.assert_close(loads["sft"][name], tensor.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda message, name=name: f"{family} {name}: {message}")
        assert_reloads_equal(output / "model", loads["sft"])


# -- packing, lean activations, sequence classifiers: forward and backward checks ------------------


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_packed_rows_give_the_logits_of_sequences_alone(family, family_models):
    from transformers import AutoModelForCausalLM

    from trainer.modeling.attention import use_varlen_attention

    sequences = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]]  # both longer than the windows (4)
    packed = {"input_ids": torch.tensor([sum(sequences, [])]), "use_cache": False,
              "position_ids": torch.tensor([[p for sequence in sequences for p in range(len(sequence))]])}
    boundaries = torch.tensor([0, 6, 15], dtype=torch.int32)
    varlen = {"cu_seq_lens_q": boundaries, "cu_seq_lens_k": boundaries, "max_length_q": 9, "max_length_k": 9}
    model = AutoModelForCausalLM.from_pretrained(family_models[family], attn_implementation="sdpa").eval()
    alone = [model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0] for sequence in sequences]
    sft_packed = model(**packed).logits[0]  # SFT packing: sdpa, Hugging Face's block-diagonal mask
    assert use_varlen_attention(model)
    pairs_packed = model(**packed, **varlen).logits[0]  # pair packing: the variable-length attention
    varlen_alone = model(input_ids=torch.tensor([sequences[1]]), use_cache=False).logits[0]  # unpadded, no boundaries
    for name, together in (("sft", sft_packed), ("pairs", pairs_packed)):
        torch.testing.assert_close(together[:6], alone[0], rtol=1e-5, atol=1e-5, msg=f"{family} {name}")
        torch.testing.assert_close(together[6:], alone[1], rtol=1e-5, atol=1e-5, msg=f"{family} {name}")
    torch.testing.assert_close(varlen_alone, alone[1], rtol=1e-5, atol=1e-5, msg=family)


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_activations_apply_where_documented_and_match_hugging_faces_gradients(family, family_models):
    from trainer.config import ModelConfig
    from trainer.modeling.lean_activations import use_lean_activations
    from trainer.modeling.models import load_causal_lm

    hugging_face = load_causal_lm(ModelConfig(path=str(family_models[family]), lean_activations=False))
    lean = load_causal_lm(ModelConfig(path=str(family_models[family])))
    replaced = [name for name, module in lean.named_modules() if "forward" in module.__dict__]
    layers, norms_per_layer = 2, 4 if family == "qwen3" else 2  # Qwen3 adds query and key norms
    assert len(replaced) == (layers * (1 + norms_per_layer) + 1 if family in LEAN_FAMILIES else 0), replaced
    assert use_lean_activations(hugging_face) == len(replaced)  # the same modules, counted by the function itself
    hugging_face = load_causal_lm(ModelConfig(path=str(family_models[family]), lean_activations=False))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20]])
    grads = []
    for model in (hugging_face, lean):
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids, use_cache=False).logits[:, :-1].flatten(0, 1),
                                                 ids[:, 1:].flatten())
        loss.backward()
        grads.append({name: parameter.grad for name, parameter in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=f"{family} {name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_sequence_classifier_head_scores_like_hugging_face(family, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from trainer.config import ModelConfig
    from trainer.modeling.models import load_value_model
    from trainer.tiny.families import build_family_config
    from trainer.tiny.model import build_tokenizer

    config = build_family_config(family, len(build_tokenizer()))
    config.num_labels = 1
    torch.manual_seed(5)
    classifier = AutoModelForSequenceClassification.from_config(config).eval()
    classifier.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    model = load_value_model(ModelConfig(path=str(tmp_path)), key="reward.model_path").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, -1], classifier(input_ids=ids).logits[:, 0], rtol=0, atol=1e-5)
