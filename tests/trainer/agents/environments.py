"""Environments the agent tests register through ALIGNFLOW_ENVIRONMENTS (as a platform would)."""

import time

from trainer.agents.environment import Environment, Observation


class EchoEnvironment(Environment):
    """Never ends: answers every turn with the user message `go N` (N the turn number)."""

    def step(self, turn):
        self.turns = getattr(self, "turns", 0) + 1
        return Observation(messages=[{"role": "user", "content": f"go {self.turns}"}])


class EndsOnOddRowsEnvironment(Environment):
    """Ends after the first turn where the row's `answer` is odd, else never (so episodes finish at different turns)."""

    def step(self, turn):
        return Observation(messages=[{"role": "user", "content": "more"}], done=int(self.row["answer"]) % 2 == 1,
                           reward=0.5)


class SlowEnvironment(Environment):
    """Takes 0.3 s to answer, then ends."""

    def step(self, turn):
        time.sleep(0.3)
        return Observation(done=True)


class BrokenEnvironment(Environment):
    def step(self, turn):
        raise RuntimeError("bug in the environment")


def hang(seconds: float) -> str:
    """Sleep (a tool that hangs)."""
    time.sleep(seconds)
    return "woke"


class MarkedEchoEnvironment(EchoEnvironment):
    """`EchoEnvironment` that appends a line to the file AGENT_TEST_MARKER at every step (so a test can kill a
    run in the middle of an episode)."""

    def step(self, turn):
        import os

        with open(os.environ["AGENT_TEST_MARKER"], "a") as marker:
            marker.write("step\n")
        return super().step(turn)


def shorter_answers(prompt: str, completion: str, answer: str | None) -> float:
    """A reward that differs between an episode's samples from the first step: the shorter the last turn, the more."""
    return -len(completion) / 8
