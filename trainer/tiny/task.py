"""A small addition task whose answers can be checked.

Prompts are `"a+b="` with single-digit operands and the answer is the decimal sum. SFT rows teach
the format, preference rows prefer the correct sum over a near miss or a malformed answer, unpaired rows (KTO) are
the same answers labelled desirable or not, and prompt rows carry the answer so a reward function
(`check_answer`) can score generations for PPO/GRPO.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def problems(max_operand: int = 9) -> list[tuple[str, str]]:
    return [(f"{a}+{b}=", str(a + b)) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def check_answer(completion: str, answer: str) -> float:
    """1.0 when the completion (up to the first end token or newline) is exactly the answer."""
    text = completion.split("<|end|>")[0].split("\n")[0].strip()
    return 1.0 if text == answer else 0.0


def _wrong_answer(answer: str, rng: random.Random) -> str:
    """A near miss, or a malformed answer (empty, or a digit too many) so a reward model trained on
    these pairs also penalises the shapes a policy could otherwise exploit."""
    value = int(answer)
    candidates = [str(value + d) for d in (-3, -2, -1, 1, 2, 3, 10) if value + d >= 0]
    return rng.choice(candidates + ["", answer + answer[-1]])


def sft_rows(max_operand: int = 9, chat: bool = False) -> list[dict]:
    rows = []
    for prompt, answer in problems(max_operand):
        if chat:
            rows.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
        else:
            rows.append({"prompt": prompt, "completion": answer})
    return rows


def preference_rows(num_per_problem: int, seed: int, max_operand: int = 9) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt": prompt, "chosen": answer, "rejected": _wrong_answer(answer, rng)}
        for prompt, answer in problems(max_operand)
        for _ in range(num_per_problem)
    ]


def unpaired_rows(pairs: list[dict]) -> list[dict]:
    """KTO's rows from preference pairs: each chosen answer labelled desirable, each rejected one undesirable."""
    return [{"prompt": pair["prompt"], "completion": pair[side], "label": side == "chosen"}
            for pair in pairs for side in ("chosen", "rejected")]


def prompt_rows(max_operand: int = 9) -> list[dict]:
    return [{"prompt": prompt, "answer": answer} for prompt, answer in problems(max_operand)]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_task(directory: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write the task's datasets as JSONL files; returns their paths by name."""
    directory = Path(directory)
    rows = sft_rows()
    held_out = set(range(0, len(rows), 5))  # every fifth problem is never shown to SFT
    pref_train, pref_eval = preference_rows(8, seed), preference_rows(1, seed + 1)
    return {
        "sft_train": write_jsonl([r for i, r in enumerate(rows) if i not in held_out], directory / "sft_train.jsonl"),
        "sft_eval": write_jsonl([rows[i] for i in sorted(held_out)], directory / "sft_eval.jsonl"),
        "pref_train": write_jsonl(pref_train, directory / "pref_train.jsonl"),
        "pref_eval": write_jsonl(pref_eval, directory / "pref_eval.jsonl"),
        "kto_train": write_jsonl(unpaired_rows(pref_train), directory / "kto_train.jsonl"),
        "kto_eval": write_jsonl(unpaired_rows(pref_eval), directory / "kto_eval.jsonl"),
        # Online stages train on the SFT problems and are evaluated on the held-out ones.
        "prompts": write_jsonl([r for i, r in enumerate(prompt_rows()) if i not in held_out], directory / "prompts.jsonl"),
        "eval_prompts": write_jsonl([prompt_rows()[i] for i in sorted(held_out)], directory / "eval_prompts.jsonl"),
    }


def reward(prompt: str, completion: str, answer: str | None) -> float:
    """The task's reward function for PPO/GRPO, the built-in `reward.function: tiny_addition`
    (`trainer.rewards.function_registry`; its import path `trainer.tiny.task:reward` is an alias)."""
    return check_answer(completion, answer or "")
