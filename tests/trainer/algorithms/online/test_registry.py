"""The online algorithm is chosen once, from `ONLINE_ALGORITHMS`: every online stage has a row, a stage
without one is a config error, and no file outside the table tests a stage config's class to choose.

The last check is static (`ast`, nothing imported): it finds `isinstance`/`issubclass` calls and
`type(x) is/== C` comparisons that name a stage config class, anywhere in `trainer`, `components`
and `pipelines` except the table's own file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainer import config as config_module
from trainer.algorithms.online.registry import ONLINE_ALGORITHMS, online_algorithm
from trainer.config import STAGE_CONFIGS, OnlineStageConfig, StageConfig, build_config
from trainer.errors import ConfigError
from trainer.online.loop import TRAINERS

ROOT = Path(__file__).resolve().parents[4]
PACKAGES = ("trainer", "components", "pipelines")
TABLE_FILE = Path("trainer/algorithms/online/registry.py")
STAGE_CONFIG_NAMES = frozenset(name for name, value in vars(config_module).items()
                               if isinstance(value, type) and issubclass(value, StageConfig))


def named_classes(node: ast.expr) -> set[str]:
    """The class names an `isinstance` argument or a comparison operand spells (`C`, `config.C`, `(C, D)`)."""
    if isinstance(node, ast.Tuple):
        return set().union(*(named_classes(element) for element in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def is_type_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"


def class_tests(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, stage config class) of every class test in `source` that names a stage config."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: set[str] = set()
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            names = named_classes(node.args[1])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.Eq)) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(is_type_call(operand) for operand in operands):
                names = set().union(*(named_classes(operand) for operand in operands))
        found += [(node.lineno, name) for name in sorted(names & STAGE_CONFIG_NAMES)]
    return found


def test_no_file_outside_the_table_tests_a_stage_configs_class():
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative == TABLE_FILE:
                continue
            source = path.read_text()
            if not any(name in source for name in STAGE_CONFIG_NAMES):  # most files: nothing to parse
                continue
            offenders += [f"{relative}:{line}: {name}" for line, name in class_tests(source, str(path))]
    assert not offenders, ("choose the algorithm with trainer.algorithms.online.registry.online_algorithm, "
                           "not by the config's class:\n" + "\n".join(offenders))


def test_the_scan_sees_each_kind_of_class_test():
    source = ("isinstance(config, GRPOConfig)\nisinstance(c, (config.PPOConfig, int))\n"
              "type(config) is SFTConfig\nisinstance(x, dict)\ntype(x) == list\n")
    assert class_tests(source, "example.py") == [(1, "GRPOConfig"), (2, "PPOConfig"), (3, "SFTConfig")]


def test_every_online_stage_has_an_algorithm_named_after_it_and_a_trainer():
    online_stages = {stage: cls for stage, cls in STAGE_CONFIGS.items() if issubclass(cls, OnlineStageConfig)}
    assert set(ONLINE_ALGORITHMS) == set(online_stages.values())
    assert {stage: ONLINE_ALGORITHMS[cls].name for stage, cls in online_stages.items()} == \
        {stage: stage for stage in online_stages}
    assert set(TRAINERS) == set(online_stages)  # PPOTrainer and GRPOTrainer, ColossalChat's names


def test_a_stage_without_an_online_algorithm_is_a_config_error():
    sft = build_config("sft", {"output_dir": "o", "model": {"path": "m"}, "data": {"train_path": "p"}})
    with pytest.raises(ConfigError, match="SFTConfig is not an online stage; online training supports ppo and grpo"):
        online_algorithm(sft)
