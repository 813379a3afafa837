"""The agents' `python` tool runs in the sandbox `environment.sandbox` names, proved by a canary at start-up.

The remote cases use the real sandbox service on loopback (`sandbox_service`, as the trainer image's uid) with the
local sandbox made to fail in this process, so a call that went local instead would show.
"""

from __future__ import annotations

import errno
import math

import pytest

from tests.conftest import make_config
from tests.trainer.sandbox.conftest import TOKEN
from tests.trainer.sandbox.forked import in_child
from tests.trainer.sandbox.kernel import skip_without_the_local_sandbox
from trainer.agents.environment import Environment, Observation
from trainer.config.environment import EnvironmentConfig
from trainer.errors import ConfigError
from trainer.rollout.builder import build_agent
from trainer.sandbox import _landlock, _seccomp
from trainer.tiny.model import build_tokenizer


@pytest.fixture
def no_local_sandbox(monkeypatch):
    """The local sandbox raises in this process: only the service can answer."""
    import trainer.sandbox.config as config_module

    def refused(*args, **kwargs):
        raise AssertionError("the local sandbox was used")

    monkeypatch.setattr(config_module, "run_python", refused)
    monkeypatch.setattr(config_module, "check_sandbox", refused)


def remote_environment(url: str, **limits) -> EnvironmentConfig:
    return EnvironmentConfig(name="tools", tools=["python"], tool_timeout_seconds=30,
                             sandbox={"backend": "remote", "url": url, "limits": limits})


def test_the_code_tool_runs_in_the_sandbox_service_with_the_configured_limits(sandbox_service, no_local_sandbox,
                                                                               monkeypatch):
    url, _ = sandbox_service
    monkeypatch.setenv("ALIGNFLOW_SANDBOX_TOKEN", TOKEN)
    agent = build_agent(remote_environment(url, wall_seconds=1), build_tokenizer())
    assert agent.toolbox.call("python", {"code": "print(6 * 7)"}).content == "42\n"
    slow = agent.toolbox.call("python", {"code": "import time\ntime.sleep(30)"})
    assert slow.content == "[timed out after 1 s]" and slow.seconds < 10


def test_a_sandbox_service_that_refuses_the_token_stops_the_run_at_start_up(sandbox_service, no_local_sandbox,
                                                                            monkeypatch):
    url, _ = sandbox_service
    monkeypatch.setenv("ALIGNFLOW_SANDBOX_TOKEN", "not-the-token")
    with pytest.raises(ConfigError, match=r"^environment\.sandbox: .*401"):
        build_agent(remote_environment(url), build_tokenizer())


def test_without_landlock_the_code_tool_stops_the_run_at_start_up_naming_it():
    """A kernel or container profile without Landlock: the canary fails, not every call later (issue 45, item 5)."""
    skip_without_the_local_sandbox()

    def build_without_landlock():
        _landlock.set_no_new_privs()
        _seccomp.install_filter(_seccomp.build_filter(extra_denials={_landlock.CREATE_RULESET: errno.ENOSYS}))
        try:
            build_agent(EnvironmentConfig(name="tools", tools=["python"]), build_tokenizer())
        except ConfigError as err:
            return str(err)
        return "started"

    assert in_child(build_without_landlock).startswith(
        "environment.sandbox: sandbox cannot start: Landlock unavailable: the kernel has no Landlock (ENOSYS)")


def test_without_a_code_tool_no_sandbox_is_started(monkeypatch, no_local_sandbox):
    agent = build_agent(EnvironmentConfig(name="tiny_calculator"), build_tokenizer())
    assert "python" not in agent.toolbox.tools


STOPS = list("abcdefghijklmnopqrstuvwxyz0123456789")  # a turn of the untrained model ends within its 4 tokens


class RunsEachTurnEnvironment(Environment):
    """Runs `print(len(turn))` in the `python` tool each turn and ends; what it printed is kept for the test."""

    printed: list[str] = []

    def step(self, turn):
        result = self.tools.call("python", {"code": f"print({len(turn)})"})
        RunsEachTurnEnvironment.printed.append(result.content)
        return Observation(messages=[{"role": "tool", "content": result.content}], done=True)


def test_a_grpo_run_of_an_agent_is_served_by_the_sandbox_service(sandbox_service, no_local_sandbox, monkeypatch,
                                                                   tmp_path, tiny_model):
    from trainer.lifecycle.context import build_context
    from trainer.online.stages import build_online_trainer
    from trainer.tiny.agent_task import write_agent_task

    url, _ = sandbox_service
    monkeypatch.setenv("ALIGNFLOW_SANDBOX_TOKEN", TOKEN)
    monkeypatch.setenv("ALIGNFLOW_ENVIRONMENTS", f"runs_code={__name__}:RunsEachTurnEnvironment")
    RunsEachTurnEnvironment.printed.clear()
    files = write_agent_task(tmp_path / "task", num_train=8, num_eval=2)
    config = make_config("grpo", tmp_path / "run", tiny_model, files["prompts"], train={"micro_batch_size": 4},
                         generation={"max_new_tokens": 4, "temperature": 1.0, "stop": STOPS}, reward={"function": "tiny_calculator"},
                         data={"max_length": 32}, grpo={"num_episodes": 1, "rollout_batch_size": 2,
                                                        "mini_batch_size": 4, "num_generations": 2},
                         environment={"name": "runs_code", "tools": ["python"], "max_turns": 2,
                                      "max_total_tokens": 24, "tool_timeout_seconds": 30,
                                      "sandbox": {"backend": "remote", "url": url}})
    trainer = build_online_trainer(config, build_context(config))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    # 2 prompts x 2 generations; each turn that ended on a stop token got its step, run by the service
    assert 0 < len(RunsEachTurnEnvironment.printed) <= 4
    assert all(content.strip().isdigit() for content in RunsEachTurnEnvironment.printed)
    assert all(math.isfinite(value) for value in trainer.last_metrics.values())
