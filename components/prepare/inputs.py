"""The body of `prepare_inputs`: build the tiny task, or copy a dataset folder and a model."""

from __future__ import annotations

import shutil
from pathlib import Path

from trainer.errors import PipelineError
from trainer.storage import get_storage, join_uri
from trainer.storage.transfer import cached_copy


def provide_inputs(source: str, base_model_uri: str, model_path: str, dataset_paths: dict[str, str]) -> None:
    if source == "tiny":
        from trainer.tiny.model import write_tiny_model
        from trainer.tiny.task import write_task

        write_tiny_model(model_path)
        written = write_task(Path(model_path).parent / "tiny-task")
        for name, path in dataset_paths.items():
            shutil.copyfile(written[name], path)
        return
    if not base_model_uri:
        raise PipelineError("base_model_uri is empty; it is required unless source is 'tiny'")
    shutil.copytree(cached_copy(base_model_uri), model_path, dirs_exist_ok=True)
    storage = get_storage(source)
    for name, path in dataset_paths.items():
        uri = join_uri(source, f"{name}.jsonl")
        if not storage.exists(uri):
            raise PipelineError(f"{uri}: missing; a dataset folder holds {sorted(dataset_paths)} as .jsonl files")
        storage.download_file(uri, Path(path))
