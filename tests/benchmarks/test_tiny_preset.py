"""The tiny-preset tuning script builds, for every preset, pipeline and stage, the config the pipeline's
component would write, and the trainer accepts it with the preset's values in place (the runs are manual)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trainer.config import build_config

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "tiny_preset.py"
spec = importlib.util.spec_from_file_location("tiny_preset", SCRIPT)
tiny_preset = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny_preset)

from pipelines.presets import PRESETS  # noqa: E402  (after the script, which puts the repository on sys.path)

CASES = [(preset, pipeline, stage) for preset, pipelines in PRESETS.items() for pipeline in pipelines
         for stage in ("sft", *tiny_preset.STAGES[pipeline])]


@pytest.mark.parametrize(("preset", "pipeline", "stage"), CASES)
def test_each_stage_config_is_valid_and_carries_the_preset_and_the_seed(preset, pipeline, stage, tmp_path):
    arguments = {"base_model_uri": str(tmp_path / "model"), **PRESETS[preset][pipeline]}
    artifacts = {"base_model": str(tmp_path / "sft"), "train_dataset": str(tmp_path / "train.jsonl"),
                 "eval_dataset": str(tmp_path / "eval.jsonl")}
    if stage == "ppo":
        artifacts["reward_model"] = str(tmp_path / "rm")
    raw = tiny_preset.stage_config_for(stage, arguments, artifacts, seed=7, output_dir=tmp_path / stage)
    config = build_config(stage, raw)
    assert config.train.seed == 7 and config.tracking.backend == "none"
    by_component = {component: name for name, component in tiny_preset.STAGE_PARAMETERS[stage].items()}
    assert config.optimizer.lr == arguments[by_component["lr"]]
    if stage == "dpo":
        assert config.dpo.rpo_alpha == arguments["dpo_settings"]["dpo.rpo_alpha"]
    if stage == "ppo":
        assert config.ppo.kl_coef == arguments["ppo_kl_coef"] and config.reward.model_path == str(tmp_path / "rm")
    if stage == "sft":
        assert config.model.path == arguments["base_model_uri"] and config.train.group_by_length is False
