"""The ColossalAI adapter where ColossalAI is not installed: its config is checked, its absence is one line.

Training through ColossalAI runs in its own environment: tests/colossalai (`make test-colossalai`).
"""

from __future__ import annotations

import pytest

from tests.conftest import make_config
from trainer.errors import ConfigError


def test_colossalai_section_is_refused_with_another_plugin(tmp_path, tiny_model, task_files):
    with pytest.raises(ConfigError, match="colossalai section is given but plugin is 'ddp'"):
        make_config("sft", tmp_path, tiny_model, task_files["sft_train"],
                    parallel={"plugin": "ddp", "colossalai": {"plugin": "low_level_zero"}})


@pytest.mark.parametrize("options, problem", [
    ({"plugin": "low_level_zero", "tp_size": 2}, "tensor parallelism needs hybrid_parallel"),
    ({"plugin": "torch_ddp", "zero_stage": 2}, "it applies to low_level_zero and hybrid_parallel"),
    ({"plugin": "gemini", "zero_stage": 1}, "it applies to low_level_zero and hybrid_parallel"),
    ({"plugin": "low_level_zero", "zero_stage": 0}, "use 1 or 2"),
    ({"plugin": "torch_ddp", "cpu_offload": True}, "keeps everything on the device"),
])
def test_colossalai_knobs_of_another_colossalai_plugin_are_refused(options, problem, tmp_path, tiny_model, task_files):
    with pytest.raises(ConfigError, match=problem):
        make_config("sft", tmp_path, tiny_model, task_files["sft_train"],
                    parallel={"plugin": "colossalai", "colossalai": options})


def test_colossalai_plugin_without_colossalai_fails_in_one_line(tmp_path, tiny_model, task_files):
    try:
        import colossalai  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("colossalai is installed here (tests/colossalai covers it)")
    import torch

    from trainer.parallel.plugins import make_plugin
    from trainer.runtime import DistributedEnv

    config = make_config("sft", tmp_path, tiny_model, task_files["sft_train"], parallel={"plugin": "colossalai"})
    with pytest.raises(ConfigError) as raised:
        make_plugin(config.parallel, DistributedEnv(0, 0, 1), torch.device("cpu"))

    assert "parallel.plugin is 'colossalai' but colossalai is not importable here" in str(raised.value)
    assert "\n" not in str(raised.value)
