"""The in-process weight channel between the trainer and explorer threads (the seed's "memory" sync).

Trinity-RFT's `Synchronizer` (`trinity/manager/synchronizer.py`) is a Ray actor that holds the
newest model state dict uploaded by the trainer (`set_model_state_dict`) for explorers to fetch.
Here it is a plain object shared by threads of one process: `ActorRolloutRefWorker.upload_state_dict`
sets a version, `Explorer.refresh_weights` waits for and reads it. Between processes the weights
travel through the weights directory instead (`trainer.asynchronous.weights`, the seed's
"checkpoint" sync).
"""

from __future__ import annotations

import threading

import torch

from trainer.errors import WaitTimeout


class Synchronizer:
    """The newest published policy version and its state dict, guarded by a condition variable."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._version = -1
        self._state_dict: dict[str, torch.Tensor] | None = None

    @property
    def latest_version(self) -> int:
        """Newest version set, or -1 before the first."""
        with self._condition:
            return self._version

    def set_model_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Publish `state_dict` as `version`. The tensors must not change afterwards (pass a copy)."""
        with self._condition:
            self._version, self._state_dict = version, state_dict
            self._condition.notify_all()

    def get_model_state_dict(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The newest version and its state dict; WaitTimeout when nothing is published yet."""
        with self._condition:
            if self._state_dict is None:
                raise WaitTimeout("no weight version uploaded to the in-process synchronizer yet")
            return self._version, self._state_dict

    def wait_for_version(self, minimum: int, timeout: float) -> int:
        """Block until a version >= `minimum` is set; WaitTimeout after `timeout` seconds."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._version >= minimum, timeout):
                raise WaitTimeout(f"in-process synchronizer: weight version {minimum} not uploaded after "
                                  f"{timeout:g} s (newest is {self._version}); is the trainer running?")
            return self._version
