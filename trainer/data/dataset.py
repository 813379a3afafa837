"""Load a dataset file into a list of tokenized examples, checking every row first.

A bad row fails the load with its `file:line`, or, with `skip_bad_rows`, is skipped and counted.
Datasets are held in memory: the workloads this trainer targets (post-training sets of up to a few
hundred thousand rows) fit, and it keeps the sampler exact and resumable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.data.readers import iter_rows
from trainer.data.schemas import check_preference_row, check_prompt_row, check_sft_row, check_unpaired_row
from trainer.data.tokenize import encode_preference, encode_prompt, encode_sft, encode_unpaired
from trainer.errors import DataError

logger = logging.getLogger(__name__)

SCHEMAS: dict[str, Callable[[Any], str | None]] = {
    "sft": check_sft_row,
    "preference": check_preference_row,
    "prompt": check_prompt_row,
    "unpaired": check_unpaired_row,
}


@dataclass(slots=True)
class LoadedDataset:
    examples: list[dict]
    num_skipped: int
    path: str


def load_rows(path: str, schema: str, *, skip_bad_rows: bool,
              encode: Callable[[dict], dict] | None = None) -> LoadedDataset:
    """Read, check and (optionally) encode every row of `path`.

    Args:
        path: A .jsonl/.parquet file or a saved HF datasets directory.
        schema: `sft`, `preference`, `prompt` or `unpaired`.
        skip_bad_rows: Skip and count bad rows instead of raising on the first.
        encode: Turns a valid row into an example; a DataError it raises marks the row bad.

    Returns:
        The examples, with the number of rows skipped.

    Raises:
        DataError: naming `file:line` of the first bad row (unless skipped), or an empty dataset.
    """
    check = SCHEMAS[schema]
    examples, num_skipped = [], 0
    for where, row in iter_rows(path):
        try:
            if isinstance(row, DataError):
                raise row
            problem = check(row)
            if problem:
                raise DataError(f"{where}: {problem}")
            examples.append(encode(row) if encode else row)
        except DataError as err:
            message = str(err) if str(err).startswith(where) else f"{where}: {err}"
            if not skip_bad_rows:
                raise DataError(message) from None
            num_skipped += 1
            logger.warning("skipping bad row: %s", message)
    if num_skipped:
        logger.warning("%s: skipped %d bad rows", path, num_skipped)
    if not examples:
        raise DataError(f"{path}: no usable rows ({num_skipped} skipped)")
    return LoadedDataset(examples, num_skipped, path)


def load_sft_dataset(path: str, tokenizer: Any, max_length: int, skip_bad_rows: bool) -> LoadedDataset:
    return load_rows(path, "sft", skip_bad_rows=skip_bad_rows,
                     encode=lambda row: encode_sft(tokenizer, row, max_length))


def load_preference_dataset(path: str, tokenizer: Any, max_length: int, skip_bad_rows: bool) -> LoadedDataset:
    return load_rows(path, "preference", skip_bad_rows=skip_bad_rows,
                     encode=lambda row: encode_preference(tokenizer, row, max_length))


def load_prompt_dataset(path: str, tokenizer: Any, max_length: int, skip_bad_rows: bool) -> LoadedDataset:
    """Prompt rows of an online stage, each with its token ids (`prompt_ids`, what a rollout samples after),
    none longer than `max_length`.

    A longer prompt is a bad row rather than cut: cutting it would change the question the reward judges, and
    generating after it could run past the model's positions far into a run.
    """
    def fits(row: dict) -> dict:
        ids = encode_prompt(tokenizer, row["prompt"])
        if len(ids) > max_length:
            raise DataError(f"prompt is {len(ids)} tokens, longer than data.max_length ({max_length}); raise "
                            "data.max_length, shorten the prompt, or set data.skip_bad_rows")
        return {**row, "prompt_ids": ids}

    return load_rows(path, "prompt", skip_bad_rows=skip_bad_rows, encode=fits)


def load_unpaired_dataset(path: str, tokenizer: Any, max_length: int, skip_bad_rows: bool) -> LoadedDataset:
    return load_rows(path, "unpaired", skip_bad_rows=skip_bad_rows,
                     encode=lambda row: encode_unpaired(tokenizer, row, max_length))
