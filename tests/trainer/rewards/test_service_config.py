"""A reward source's service URL is parsed in full, and its numbers must be finite, when the config loads: each
mistake is one line naming the dotted key, long before the model loads."""

from __future__ import annotations

import pytest

from tests.trainer.config.test_rewards import load  # the same base config, written with the YAML under test
from trainer.errors import ConfigError


def load_url(tmp_path, url: str):
    """A config whose remote source's URL is `url`, written as a YAML double-quoted string (escapes allowed)."""
    return load(tmp_path, f'reward:\n  sources: [{{kind: remote, service: {{url: "{url}"}}}}]\n')


@pytest.mark.parametrize(("url", "expected"), [
    ("http://rm:notaport/score", r"a well-formed URL \(Port could not be cast to integer value as 'notaport'\)"),
    ("http://rm:99999999/score", r"a well-formed URL \(Port out of range 0-65535\)"),
    ("http://rm:0/score", r"a URL whose port is 1-65535"),
    ("http://rm:8000/my score", r"a URL of printable ASCII without spaces; found ' ' at character 18"),
    ("http://rm:8000/score\\n", r"a URL of printable ASCII without spaces; found '\\n' at character 21"),
    ("http://rm:8000/sc\\tore", r"a URL of printable ASCII without spaces; found '\\t' at character 18"),
    ("http://rm:8000/scoré", r"a URL of printable ASCII without spaces; found 'é' at character 20"),
    ("http://[::1", r"a well-formed URL \(Invalid IPv6 URL\)"),
    ("http://::1]:8000/score", r"a well-formed URL \(Invalid IPv6 URL\)"),
    ("ftp://rm/score", r"a URL with its scheme and host"),
    ("http:///score", r"a URL with its scheme and host"),
    ("rm:8000/score", r"a URL with its scheme and host"),
    ("http://user:pw@rm:8000/score", r"a URL without user info \(put credentials in token_env or token_file\)"),
])
def test_a_bad_service_url_is_one_line_naming_the_key(tmp_path, url, expected):
    with pytest.raises(ConfigError, match=r"run.yaml:\d+: reward.sources.0.service.url is .*, expected: " +
                       expected) as error:
        load_url(tmp_path, url)
    assert len(str(error.value).splitlines()) == 2  # "invalid config:" and the one problem


@pytest.mark.parametrize("url", ["http://rm:8000/score", "https://judge.example/v1", "http://[::1]:8000/score",
                                 "http://127.0.0.1:65535/score?model=a", "http://rm/score"])
def test_a_good_service_url_loads_as_written(tmp_path, url):
    assert load_url(tmp_path, url).reward.sources[0].service.url == url


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_a_weight_must_be_finite(tmp_path, weight):
    with pytest.raises(ConfigError, match=r"run.yaml:\d+: reward.sources.1.weight is (nan|inf|-inf), expected: "
                                          r"Input should be a finite number"):
        load(tmp_path, f"reward:\n  sources: [{{kind: math}}, {{kind: exact_match, weight: {weight}}}]\n")


@pytest.mark.parametrize("key", ["timeout_seconds", "backoff_seconds", "max_backoff_seconds"])
def test_the_service_times_must_be_finite(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"reward.sources.0.service.{key} is (nan|inf), expected: "):
        load(tmp_path, f"reward:\n  sources: [{{kind: remote, service: {{url: 'http://rm/', {key}: .inf}}}}]\n")
