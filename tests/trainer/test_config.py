"""Tests of `trainer.config`: loading YAML with `--set` overrides, error locations, defaults, help."""

from __future__ import annotations

import textwrap
import typing
from pathlib import Path

import pytest

from trainer.config import (
    STAGE_CONFIGS,
    DPOAlgorithmConfig,
    DPOConfig,
    OptimizerConfig,
    Section,
    TrainConfig,
    describe_fields,
    load_config,
)
from trainer.errors import AlignflowError, ConfigError

# A complete DPO config; tests replace single lines to break it. Line numbers are 1-based:
#  1 output_dir   2 model   3 path   4 (free)   5 data   6 train_path   7 dpo   8 beta
VALID_DPO = """\
output_dir: out
model:
  path: models/tiny
  gradient_checkpointing: false
data:
  train_path: data/train.jsonl
dpo:
  beta: 0.1
"""


def write_yaml(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(err: pytest.ExceptionInfo) -> list[str]:
    """The individual problem lines of a ConfigError ("invalid config:" header removed)."""
    lines = [line.strip() for line in str(err.value).splitlines()]
    return [line for line in lines if line and line != "invalid config:"]


# ---------------------------------------------------------------------------------------------
# Errors name path:line and the dotted key


def test_unknown_key_names_file_line_and_dotted_key(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("  gradient_checkpointing: false", "  bogus: 1"))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    assert problems(err) == [f"{path}:4: unknown key model.bogus"]


@pytest.mark.parametrize(("old", "new", "line", "key"), [
    ("data/train.jsonl", "gs://b/x.jsonl", 6, "data.train_path"),
    ("models/tiny", "https://hub.example/tiny", 3, "model.path"),
    ("output_dir: out", "output_dir: gs://b/run", 1, "output_dir"),
])
def test_a_location_with_a_scheme_no_storage_serves_names_line_key_and_scheme(tmp_path, old, new, line, key):
    path = write_yaml(tmp_path, VALID_DPO.replace(old, new))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    value = new.removeprefix("output_dir: ")
    assert problems(err) == [f"{path}:{line}: {key} is {value!r}, expected: a local path, file://, s3:// or minio:// "
                             f"(with AWS_ENDPOINT_URL pointing at the MinIO service); {value.split('://')[0]}:// "
                             "is not supported"]


def test_unknown_top_level_section_is_an_error(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO + "ppo:\n  kl_coef: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    assert problems(err) == [f"{path}:9: unknown key ppo"]


def test_wrong_type_names_file_line_dotted_key_and_value(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO + "train:\n  max_epochs: abc\n")
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    [problem] = problems(err)
    assert problem.startswith(f"{path}:10: train.max_epochs is 'abc', expected:")
    assert "integer" in problem


def test_out_of_range_beta_names_line_and_dotted_key(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("beta: 0.1", "beta: -0.1"))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    [problem] = problems(err)
    assert problem.startswith(f"{path}:8: dpo.beta is -0.1, expected:")
    assert "greater than 0" in problem


def test_missing_required_field_points_at_its_section_line(tmp_path):
    # model.path has no line of its own; the error points at the enclosing `model:` key (line 2).
    path = write_yaml(tmp_path, VALID_DPO.replace("  path: models/tiny\n", ""))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    assert problems(err) == [f"{path}:2: missing required field model.path"]


def test_missing_required_section_names_file_and_key(tmp_path):
    path = write_yaml(tmp_path, "output_dir: out\nmodel:\n  path: m\n")
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    assert problems(err) == [f"{path}: missing required field data"]


def test_every_problem_is_reported_in_one_error(tmp_path):
    text = VALID_DPO.replace("  gradient_checkpointing: false", "  bogus: 1").replace("beta: 0.1", "beta: -0.1")
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    found = problems(err)
    assert len(found) == 2
    assert f"{path}:4: unknown key model.bogus" in found
    assert any(p.startswith(f"{path}:8: dpo.beta is -0.1") for p in found)


def test_label_smoothing_with_ipo_is_rejected_naming_both_values(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO + "  loss_type: ipo\n  label_smoothing: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    [problem] = problems(err)
    # A cross-field check belongs to the section: it points at the `dpo:` line (7).
    assert problem.startswith(f"{path}:7: dpo is ")
    assert "label_smoothing is 0.1 but loss_type is 'ipo'" in problem
    assert "Value error" not in problem


def test_label_smoothing_with_sigmoid_is_accepted(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO + "  loss_type: sigmoid\n  label_smoothing: 0.1\n")
    assert load_config("dpo", path).dpo.label_smoothing == 0.1


def test_invalid_yaml_names_the_line(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("beta: 0.1", "beta: 0.1: 0.2"))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path)
    assert str(err.value).startswith(f"{path}:8: invalid YAML:")
    assert isinstance(err.value.__cause__, Exception)  # raised `from` the YAML error


def test_top_level_that_is_not_a_mapping_is_rejected(tmp_path):
    path = write_yaml(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match=r":1: expected a mapping of sections at the top, found list"):
        load_config("dpo", path)


def test_unreadable_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config("dpo", tmp_path / "absent.yaml")


def test_unknown_stage_is_rejected(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO)
    with pytest.raises(ConfigError, match="unknown stage 'cpo'"):
        load_config("cpo", path)


def test_config_error_is_an_alignflow_error():
    assert issubclass(ConfigError, AlignflowError)


# ---------------------------------------------------------------------------------------------
# --set overrides


def test_override_sets_a_float_from_scientific_notation(tmp_path):
    config = load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["optimizer.lr=1e-4"])
    assert config.optimizer.lr == 1e-4
    assert type(config.optimizer.lr) is float


def test_override_replaces_a_value_from_the_file(tmp_path):
    config = load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["dpo.beta=0.5", "model.path=other"])
    assert config.dpo.beta == 0.5
    assert config.model.path == "other"


def test_override_can_create_a_section_absent_from_the_file(tmp_path):
    config = load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["train.max_epochs=3"])
    assert config.train.max_epochs == 3
    assert config.train.micro_batch_size == 8  # the rest of the new section keeps its defaults


def test_override_with_bad_value_is_blamed_on_the_flag(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO)
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path, ["optimizer.lr=abc"])
    [problem] = problems(err)
    assert problem.startswith("--set optimizer.lr: optimizer.lr is 'abc', expected:")
    assert str(path) not in problem


def test_override_with_out_of_range_value_is_blamed_on_the_flag_not_the_file(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO)  # dpo.beta is valid in the file (line 8)
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path, ["dpo.beta=-1"])
    [problem] = problems(err)
    assert problem.startswith("--set dpo.beta: dpo.beta is -1, expected:")


def test_override_with_unknown_key_is_blamed_on_the_flag(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["model.bogus=1"])
    assert problems(err) == ["--set model.bogus: unknown key model.bogus"]


def test_override_with_unparsable_yaml_value_names_the_flag(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["optimizer.lr=["])
    assert str(err.value).startswith("--set optimizer.lr: cannot parse value '['")


@pytest.mark.parametrize("override", ["optimizer.lr", "=1e-4"])
def test_malformed_override_without_key_or_equals_is_rejected(tmp_path, override):
    with pytest.raises(ConfigError) as err:
        load_config("dpo", write_yaml(tmp_path, VALID_DPO), [override])
    assert str(err.value).startswith(f"--set {override!r}: expected key=value")


def test_override_through_a_scalar_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"^--set model.path.deeper: path is not a section"):
        load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["model.path.deeper=1"])


# ---------------------------------------------------------------------------------------------
# Defaults


def test_defaults_fill_every_section_left_out(tmp_path):
    config = load_config("dpo", write_yaml(tmp_path, VALID_DPO))
    assert isinstance(config, DPOConfig)
    assert config.optimizer == OptimizerConfig()
    assert config.train == TrainConfig()
    assert config.optimizer.lr == 1e-5
    assert config.optimizer.betas == (0.9, 0.999)
    assert config.data.max_length == 512
    assert config.data.eval_path is None
    assert config.model.lora is None
    assert config.dpo == DPOAlgorithmConfig(beta=0.1)
    assert config.parallel.plugin == "auto"


def test_each_stage_loads_its_own_config_class(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("dpo:\n  beta: 0.1\n", ""))
    online = ["reward.function=trainer.tiny.task:reward"]  # the online stages need a reward source
    for stage, config_class in STAGE_CONFIGS.items():
        assert type(load_config(stage, path, online if stage in ("ppo", "grpo") else [])) is config_class


def test_online_stage_needs_exactly_one_reward_source(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("dpo:\n  beta: 0.1\n", ""))
    with pytest.raises(ConfigError, match="missing required field reward"):
        load_config("ppo", path)
    with pytest.raises(ConfigError, match="set exactly one of model_path"):
        load_config("grpo", path, ["reward.function=m:f", "reward.model_path=/rm"])


def test_default_lists_are_not_shared_between_configs(tmp_path):
    first = load_config("dpo", write_yaml(tmp_path, VALID_DPO), ["model.lora={}"])
    second = load_config("dpo", write_yaml(tmp_path, VALID_DPO, "other.yaml"), ["model.lora={}"])
    first.model.lora.target_modules.append("gate_proj")
    assert "gate_proj" not in second.model.lora.target_modules


# ---------------------------------------------------------------------------------------------
# describe_fields (what `--help-config` prints)


def _leaf_keys(model: type[Section], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        # `LoraConfig | None` counts as the section it wraps.
        annotation = next((a for a in typing.get_args(field.annotation) if a is not type(None)), field.annotation)
        if isinstance(annotation, type) and issubclass(annotation, Section):
            keys |= _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_describe_fields_lists_every_leaf_with_default_and_description():
    lines = describe_fields(DPOConfig)
    keys = {line.split(" ", 1)[0] for line in lines}
    assert keys == _leaf_keys(DPOConfig)
    assert len(keys) == len(lines)  # one line each
    assert {"dpo.beta", "optimizer.lr", "model.path", "data.train_path", "output_dir"} <= keys
    by_key = {line.split(" ", 1)[0]: line for line in lines}
    assert by_key["dpo.beta"].startswith("dpo.beta (0.1): ")
    assert by_key["model.path"].startswith("model.path (required): ")
    assert all(not line.endswith(": None") for line in lines)  # every field has a description


def test_describe_fields_lists_leaves_of_optional_sections():
    keys = {line.split(" ", 1)[0] for line in describe_fields(DPOConfig)}
    assert {"model.lora.r", "model.lora.alpha", "model.lora.dropout", "model.lora.target_modules"} <= keys


def test_cross_field_error_from_overrides_only_is_blamed_on_the_flags(tmp_path):
    path = write_yaml(tmp_path, VALID_DPO.replace("dpo:\n  beta: 0.1\n", ""))
    with pytest.raises(ConfigError) as err:
        load_config("dpo", path, ["dpo.loss_type=ipo", "dpo.label_smoothing=0.1"])
    [problem] = problems(err)
    assert problem.startswith("--set dpo")


@pytest.mark.parametrize("parallel", [{}, {"plugin": "colossalai"},
                                      {"plugin": "colossalai", "colossalai": {"plugin": "low_level_zero"}}])
def test_a_dumped_config_loads_back_unchanged(parallel, tmp_path):
    from trainer.config import build_config, dump_config, load_config

    config = build_config("sft", {"output_dir": "out", "model": {"path": "m"}, "data": {"train_path": "t.jsonl"},
                                  "parallel": parallel})
    dump_config(config, tmp_path / "config.yaml")  # what every run leaves beside its outputs
    assert load_config("sft", tmp_path / "config.yaml") == config
