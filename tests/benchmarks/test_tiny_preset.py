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


def test_each_variant_reruns_the_command_with_its_own_root_and_threads():
    argv = ["--preset", "tiny", "tiny-reward-hacking", "--variants", "native", "avx2", "--root", "/r", "--seeds", "1",
            "2", "--num-threads=2", "--set", "ppo_kl_coef=1"]
    assert tiny_preset.child_arguments(argv) == ["--preset", "tiny", "tiny-reward-hacking", "--seeds", "1", "2",
                                                 "--set", "ppo_kl_coef=1"]
    assert set(tiny_preset.VARIANTS) == {"native", "threads2", "avx2", "default", "sse42"}


def test_each_row_carries_the_evaluations_decision_and_the_accuracys_paired_bound():
    six_won = [[[1.0] * 6 + [0.0] * 4], [[0.0] * 10]]  # candidate, baseline: one scorer, ten prompts
    assert tiny_preset.gate({"gate/opens": 1.0}, six_won) == {"n": 10, "acc_wins": 6, "acc_losses": 0,
                                                              "acc_lower_bound": 0.1284, "gate_opens": True}
    # With a reward model (second scorer) its score is judged: it rose, but the accuracy fell, so the guard refused.
    hacked = [[[0.0, 0.0, 0.0, 0.0], [3.0, 2.0, 2.5, 1.0]], [[1.0, 1.0, 1.0, 0.0], [0.0, 0.5, 0.1, -1.0]]]
    reported = {"gate/opens": 0.0, "gate/lower_bound": 1.2, "gate/guard/reward/holds": 0.0}
    decision = tiny_preset.gate(reported, hacked)
    assert decision["rm_lower_bound"] >= 0.05 and decision["acc_lower_bound"] == -0.75
    assert not decision["guard_holds"] and not decision["gate_opens"]


def test_the_variants_table_has_a_row_per_seed_and_a_column_per_variant(capsys):
    row = {"preset": "tiny", "pipeline": "rlhf-dpo", "n": 20, "baseline_reward": 0.3, "reward": 0.8,
           "improvement": 0.5, "acc_lower_bound": 0.24, "gate_opens": True}
    tiny_preset.print_tables([{**row, "seed": 42, "variant": "native"}, {**row, "seed": 42, "variant": "avx2"}],
                             ["native", "avx2"], [42, 1])
    out = capsys.readouterr().out
    assert "| 42 | 0.30 -> 0.80 (+0.24) opens | 0.30 -> 0.80 (+0.24) opens |" in out and "| 1 | - | - |" in out
    assert "gate opens 2/2" in out
