"""What ColossalAI's pins (torch 2.5.1, transformers 4.51.3) switch off, each refused in one line.

Runs only in the ColossalAI environment (`make test-colossalai`); elsewhere the module is skipped.
"""

from __future__ import annotations

import pytest

pytest.importorskip("colossalai", reason="ColossalAI runs in its own environment: make test-colossalai")

import torch  # noqa: E402

from tests.conftest import make_config  # noqa: E402
from trainer.data.collate import pack_sft, pad_sft  # noqa: E402
from trainer.errors import ConfigError  # noqa: E402
from trainer.parallel.plugins import make_plugin  # noqa: E402
from trainer.runtime import DistributedEnv  # noqa: E402


def test_packing_would_mix_samples_under_these_pins(tiny_model, task_files):
    # Why packing is refused here: transformers 4.51.3 lets packed samples attend to each other.
    from trainer.algorithms.sft import SFTObjective
    from trainer.data.dataset import load_sft_dataset
    from trainer.modeling.models import load_tokenizer
    from trainer.tiny.model import build_tiny_llama

    tokenizer = load_tokenizer(str(tiny_model))
    by_length = sorted(load_sft_dataset(str(task_files["sft_train"]), tokenizer, 32, False).examples,
                       key=lambda example: len(example["input_ids"]))
    first, second = by_length[0], by_length[1]
    longest = {key: first[key] + second[key] for key in ("input_ids", "labels")}  # as wide as the other two
    examples = [longest, first, second]  # packing puts first and second into one row
    batch = pack_sft(examples)
    assert batch["input_ids"].shape[0] < len(examples)  # some row holds two samples
    torch.manual_seed(0)
    model = build_tiny_llama(len(tokenizer), pad_token_id=tokenizer.pad_token_id).eval()
    packed = SFTObjective()(model, batch).total
    padded = SFTObjective()(model, pad_sft(examples, tokenizer.pad_token_id)).total

    assert not torch.allclose(packed, padded, rtol=1e-5, atol=1e-5)


def test_sft_packing_is_off_by_default_and_refused_when_asked_for(tmp_path, tiny_model, task_files):
    assert make_config("sft", tmp_path, tiny_model, task_files["sft_train"]).sft.packing is False

    with pytest.raises(ConfigError) as raised:
        make_config("sft", tmp_path, tiny_model, task_files["sft_train"], sft={"packing": True})

    problem = str(raised.value).splitlines()[-1]
    assert "sft.packing is True" in problem
    assert "needs transformers>=4.56; this environment has transformers 4.51.3" in problem


def test_fsdp2_is_refused_under_torch_2_5(tmp_path, tiny_model, task_files):
    with pytest.raises(ConfigError, match=r"parallel.plugin is 'fsdp2'.*needs torch>=2.6; this environment has torch 2.5.1"):
        make_config("sft", tmp_path, tiny_model, task_files["sft_train"], parallel={"plugin": "fsdp2"})


@pytest.mark.parametrize("name", ["low_level_zero", "gemini", "hybrid_parallel"])
def test_gpu_plugins_are_refused_on_cpu(name, tmp_path, tiny_model, task_files):
    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"],
                         parallel={"plugin": "colossalai", "colossalai": {"plugin": name}})

    with pytest.raises(ConfigError, match=f"parallel.colossalai.plugin is '{name}', which needs CUDA"):
        make_plugin(config.parallel, DistributedEnv(0, 0, 1), torch.device("cpu"))
