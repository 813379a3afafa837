"""Reward functions for the tests, allowed through `ALIGNFLOW_ALLOWED_REWARD_MODULES=tests.trainer.online`."""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from trainer.rewards.function_registry import batched_reward


def length(prompt: str, completion: str, answer: str | None) -> float:
    return float(len(completion))


def raises_on_second_row(prompt: str, completion: str, answer: str | None) -> float:
    if prompt == "2+2=":
        raise ValueError("cannot score this\nsecond line of the message")
    return 1.0


def sleeps(prompt: str, completion: str, answer: str | None) -> float:
    time.sleep(3.0)
    return 0.0


def returns_nan(prompt: str, completion: str, answer: str | None) -> float:
    return math.nan if prompt == "2+2=" else 0.0


def returns_text(prompt: str, completion: str, answer: str | None) -> str:
    return "1.0"


def returns_array_scalars(prompt: str, completion: str, answer: str | None):
    return np.float64(0.5) if prompt == "1+1=" else torch.tensor([2.0])


@batched_reward
def batched_length(prompts: list[str], completions: list[str], **columns) -> list[float]:
    return [float(len(c)) + (1.0 if a == c else 0.0) for c, a in zip(completions, columns["answer"])]


@batched_reward
def batched_too_few(prompts: list[str], completions: list[str], **columns) -> list[float]:
    return [0.0] * (len(prompts) - 1)
