"""Turn validated rows into token ids and loss masks.

Plain strings are concatenated as they are (prompt, then completion, then EOS). Message lists go
through the tokenizer's chat template; the text of each turn is found by rendering growing prefixes
of the conversation, so only assistant turns (not their role headers) are trained on.
Labels use -100 for tokens that carry no loss, as Hugging Face models expect. A sequence is cut at
`max_length` tokens, and text past the cut is not tokenized at all (see `_leading_ids`).
"""

from __future__ import annotations

from typing import Any

from trainer.data.tool_calls import template_messages
from trainer.errors import DataError

IGNORE_INDEX = -100


def _render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = False) -> str:
    if not messages and not add_generation_prompt:
        return ""
    # tool calls as the template (or the plain format) writes them
    return tokenizer.apply_chat_template(template_messages(tokenizer, messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def _chat_segments(tokenizer: Any, messages: list[dict]) -> list[tuple[str, bool]]:
    """Split a rendered conversation into (text, is_trained) pieces, one or two per turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template, so message lists cannot be rendered; use plain strings")
    segments: list[tuple[str, bool]] = []
    previous = ""
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            header = _render(tokenizer, messages[:index], add_generation_prompt=True)
            if not header.startswith(previous):
                raise DataError("the chat template does not render conversations prefix by prefix")
            segments.append((header[len(previous):], False))
            previous = header
        full = _render(tokenizer, messages[: index + 1])
        if not full.startswith(previous):
            raise DataError("the chat template does not render conversations prefix by prefix")
        segments.append((full[len(previous):], message["role"] == "assistant"))
        previous = full
    return segments


# A text much longer than a row can keep is tokenized by growing prefixes, starting at this many
# characters per token still wanted (tokens seldom span more), until the prefix yields the tokens
# wanted plus a margin: tokens that far before the cut do not depend on the text after it.
CHARS_PER_TOKEN = 8
CUT_MARGIN_TOKENS = 16


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _leading_ids(tokenizer: Any, text: str, limit: int) -> list[int]:
    """The first `limit` token ids of `text`, tokenizing no more of it than that takes (a 10 MB line
    costs about what `limit` tokens cost, not what its millions of tokens would)."""
    length = (limit + CUT_MARGIN_TOKENS) * CHARS_PER_TOKEN
    while length < len(text):
        ids = _ids(tokenizer, text[:length])
        if len(ids) >= limit + CUT_MARGIN_TOKENS:
            return ids[:limit]
        length *= 4
    return _ids(tokenizer, text)[:limit]


def _encode_segments(tokenizer: Any, segments: list[tuple[str, bool]], max_length: int) -> dict[str, list[int]]:
    input_ids: list[int] = []
    labels: list[int] = []
    for text, is_trained in segments:
        if len(input_ids) >= max_length:
            break  # truncated here: the rest is never tokenized
        ids = _leading_ids(tokenizer, text, max_length - len(input_ids))
        input_ids.extend(ids)
        labels.extend(ids if is_trained else [IGNORE_INDEX] * len(ids))
    if all(label == IGNORE_INDEX for label in labels[1:]):
        raise DataError(f"no completion tokens left within max_length={max_length}")
    return {"input_ids": input_ids, "labels": labels}


def prompt_segments(tokenizer: Any, prompt: str | list[dict]) -> list[tuple[str, bool]]:
    if isinstance(prompt, str):
        return [(prompt, False)]
    return [(_render(tokenizer, prompt, add_generation_prompt=True), False)]


def completion_segments(tokenizer: Any, prompt: str | list[dict], completion: str | list[dict]) -> list[tuple[str, bool]]:
    """The prompt (untrained) followed by the completion (trained), ending in EOS for plain text."""
    if isinstance(completion, str):
        return prompt_segments(tokenizer, prompt) + [(completion + tokenizer.eos_token, True)]
    # Earlier assistant turns inside the prompt are context, not targets: only the completion trains.
    prompt_text = _render(tokenizer, list(prompt), add_generation_prompt=True)
    segments, consumed = [], 0
    for text, is_trained in _chat_segments(tokenizer, list(prompt) + list(completion)):
        segments.append((text, is_trained and consumed >= len(prompt_text)))
        consumed += len(text)
    return segments


def encode_sft(tokenizer: Any, row: dict, max_length: int) -> dict[str, list[int]]:
    """Token ids and labels of an SFT row (labels = -100 outside assistant text)."""
    if row.get("messages") is not None:
        segments = _chat_segments(tokenizer, row["messages"])
    else:
        segments = completion_segments(tokenizer, row["prompt"], row["completion"])
    return _encode_segments(tokenizer, segments, max_length)


def encode_preference(tokenizer: Any, row: dict, max_length: int) -> dict[str, Any]:
    """Chosen and rejected sequences of a preference row, each with labels on the response only."""
    chosen = _encode_segments(tokenizer, completion_segments(tokenizer, row["prompt"], row["chosen"]), max_length)
    rejected = _encode_segments(tokenizer, completion_segments(tokenizer, row["prompt"], row["rejected"]), max_length)
    return {
        "chosen_input_ids": chosen["input_ids"],
        "chosen_labels": chosen["labels"],
        "rejected_input_ids": rejected["input_ids"],
        "rejected_labels": rejected["labels"],
        "margin": float(row.get("margin") or 0.0),
    }


def encode_unpaired(tokenizer: Any, row: dict, max_length: int) -> dict[str, Any]:
    """An unpaired row (KTO): the sequence, labels on the completion only, and whether it is desirable.

    `prompt_length` is the number of tokens before the first labelled one: `pad_unpaired` joins one
    row's prompt to another row's completion there, to estimate KTO's KL reference point.
    """
    encoded = _encode_segments(tokenizer, completion_segments(tokenizer, row["prompt"], row["completion"]), max_length)
    prompt_length = next(i for i, label in enumerate(encoded["labels"]) if label != IGNORE_INDEX)
    return {**encoded, "prompt_length": prompt_length, "desirable": bool(row["label"])}


def encode_prompt(tokenizer: Any, prompt: str | list[dict]) -> list[int]:
    """Token ids of a prompt ready for generation (chat prompts end with the assistant header)."""
    return [token for text, _ in prompt_segments(tokenizer, prompt) for token in _ids(tokenizer, text)]
