"""`reward.sources` and `rollout.correction`: the shapes accepted, the older forms, and one clear line per mistake."""

from __future__ import annotations

import textwrap

import pytest

from trainer.config import load_config
from trainer.config.rewards import RewardSourceSpec
from trainer.errors import ConfigError

BASE = """\
output_dir: out
model:
  path: models/tiny
data:
  train_path: data/train.jsonl
"""


def load(tmp_path, text: str, overrides=()):
    path = tmp_path / "run.yaml"
    path.write_text(BASE + textwrap.dedent(text))
    return load_config("grpo", path, list(overrides))


def test_sources_are_read_with_their_weights(tmp_path):
    config = load(tmp_path, """\
        reward:
          sources:
            - {kind: function, name: tiny_addition, weight: 1.0}
            - {kind: format, pattern: '\\d+', weight: 0.2}
            - kind: remote
              name: rm
              weight: 0.5
              service: {url: 'http://rm:8000/score', token_env: RM_TOKEN, on_failure: zero}
            - kind: judge
              weight: 0
              service: {url: 'https://judge.example/v1'}
              judge: {model: qwen, rubric: 'Rate {response} for {prompt}'}
        """)
    sources = config.reward.resolved_sources()
    assert [(s.label, s.weight) for s in sources] == [("tiny_addition", 1.0), ("format", 0.2), ("rm", 0.5),
                                                      ("judge", 0.0)]
    assert sources[2].service.on_failure == "zero" and sources[3].judge.max_score == 10.0


def test_the_older_one_source_forms_become_one_source_lists(tmp_path):
    function = load(tmp_path, "reward: {function: tiny_addition}\n").reward.resolved_sources()
    assert function == [RewardSourceSpec(kind="function", name="tiny_addition", weight=1.0)]
    model = load(tmp_path, "reward: {model_path: /rm}\n").reward.resolved_sources()
    assert model == [RewardSourceSpec(kind="model", path="/rm")]


@pytest.mark.parametrize(("sources", "message"), [
    ("[{kind: function, name: tiny_addition, weight: 0}, {kind: format, pattern: 'x', weight: 0}]",
     r"run.yaml:\d+: reward.sources is .*expected: at least one source with a non-zero weight; every weight is 0"),
    ("[{kind: remote, service: {url: 'rm:8000/score'}}]",
     r"run.yaml:\d+: reward.sources.0.service.url is 'rm:8000/score', expected: a URL with its scheme and host"),
    ("[{kind: judge, service: {url: 'localhost/v1'}, judge: {model: m}}]", r"reward.sources.0.service.url is "),
    ("[{kind: format}]", r"reward.sources.0 is .*expected: kind format needs pattern"),
    ("[{kind: format, pattern: '(unclosed'}]", r"reward.sources.0.pattern is '\(unclosed', expected: a regular "),
    ("[{kind: math, pattern: 'x'}]", r"pattern is set but kind is math; pattern belongs to kind format"),
    ("[{kind: math}, {kind: math}]", r"distinct names; math repeats"),
    ("[{kind: shell}]", r"reward.sources.0.kind is 'shell', expected: Input should be 'function'"),
    ("[{kind: judge, service: {url: 'http://j/v1'}, judge: {model: m, rubric: 'rate {reply}'}}]",
     r"reward.sources.0.judge.rubric is 'rate \{reply\}', expected: a template using \{response\}"),
])
def test_each_mistake_is_one_line_naming_the_dotted_key(tmp_path, sources, message):
    with pytest.raises(ConfigError, match=message) as error:
        load(tmp_path, f"reward:\n  sources: {sources}\n")
    assert len(str(error.value).splitlines()) == 2  # "invalid config:" and the one problem


def test_sources_exclude_the_older_forms(tmp_path):
    with pytest.raises(ConfigError, match="set exactly one of model_path"):
        load(tmp_path, "reward: {function: tiny_addition, sources: [{kind: math}]}\n")


def test_rollout_correction_is_on_with_vllm_only_unless_set(tmp_path):
    config = load(tmp_path, "reward: {function: tiny_addition}\n")
    assert not config.rollout.is_correcting and config.rollout.correction.mode == "sequence_mask"
    assert config.rollout.model_copy(update={"engine": "vllm"}).is_correcting
    forced = load(tmp_path, "reward: {function: tiny_addition}\n", ["rollout.correction.enabled=true"])
    assert forced.rollout.is_correcting
    with pytest.raises(ConfigError, match="rollout.correction is .*clip_min \\(4.0\\) below clip_max \\(3.0\\)"):
        load(tmp_path, "reward: {function: tiny_addition}\nrollout: {correction: {clip_min: 4}}\n")
