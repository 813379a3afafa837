"""Make an exported HF model directory loadable by MLflow where it lies: an MLmodel file beside the weights.

The directory (local, s3:// or minio://) gets `MLmodel` (the `transformers` flavor with
`model_binary: .`, so the weights are read from the directory itself, plus `python_function`),
`requirements.txt`, `python_env.yaml`, and a copy of the tokenizer's small files under
`components/tokenizer/` (where the flavor looks for them). The weights are not copied: the
registry version's source is this directory, and `mlflow.pyfunc.load_model("models:/NAME@champion")`
or `mlflow.transformers.load_model(...)` download it from there.
"""

from __future__ import annotations

import json
import platform
import posixpath
import time
import uuid

import yaml

from trainer.errors import PipelineError
from trainer.storage import get_storage, join_uri

TOKENIZER_FILES = {"special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt",
                   "merges.txt", "added_tokens.json"}
MLFLOW_FILES = ("MLmodel", "requirements.txt", "python_env.yaml")


def is_tokenizer_file(name: str) -> bool:
    return name.startswith("tokenizer") or name in TOKENIZER_FILES


def registry_source(model_uri: str) -> str:
    """The URI MLflow downloads the model from: KFP's `minio://` is S3 to MLflow (MLFLOW_S3_ENDPOINT_URL)."""
    return "s3://" + model_uri[len("minio://"):] if model_uri.startswith("minio://") else model_uri


def flavor_config(config: dict, name: str) -> dict:
    """The `transformers` flavor section for a causal LM whose files sit at the model root."""
    architectures = config.get("architectures") or ["AutoModelForCausalLM"]
    flavor = {"code": None, "components": ["tokenizer"], "instance_type": "TextGenerationPipeline",
              "model_binary": ".", "pipeline_model_type": architectures[0], "source_model_name": name,
              "task": "text-generation", "tokenizer_type": "AutoTokenizer",
              "transformers_version": config.get("transformers_version")}
    dtype = config.get("dtype") or config.get("torch_dtype")
    if isinstance(dtype, str):
        flavor["torch_dtype"] = f"torch.{dtype}"
    return flavor


def mlmodel(config: dict, name: str, mlflow_version: str) -> dict:
    return {
        "flavors": {
            "python_function": {"env": {"virtualenv": "python_env.yaml"}, "loader_module": "mlflow.transformers",
                                "python_version": platform.python_version()},
            "transformers": flavor_config(config, name),
        },
        "mlflow_version": mlflow_version,
        "model_uuid": uuid.uuid4().hex,
        "utc_time_created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "signature": {"inputs": '[{"type": "string", "required": true}]',
                      "outputs": '[{"type": "string", "required": true}]', "params": None},
    }


def write_mlflow_model(model_uri: str, name: str) -> list[str]:
    """Write the MLflow model files into the HF model directory at `model_uri`; returns what was written.

    Raises PipelineError when the directory has no `config.json` (not an exported HF model).
    """
    import mlflow

    model_uri = model_uri.rstrip("/")
    storage = get_storage(model_uri)
    config_uri = join_uri(model_uri, "config.json")
    if not storage.exists(config_uri):
        raise PipelineError(f"{model_uri}: no config.json; expected an exported Hugging Face model directory")
    config = json.loads(storage.read_bytes(config_uri))
    written = []
    for uri in storage.list(model_uri):
        relative = uri.split(model_uri.split("://", 1)[-1], 1)[-1].lstrip("/")
        if "/" not in relative and is_tokenizer_file(relative):
            target = join_uri(model_uri, "components", "tokenizer", relative)
            storage.write_bytes(target, storage.read_bytes(uri))
            written.append(posixpath.join("components", "tokenizer", relative))
    if not written:
        raise PipelineError(f"{model_uri}: no tokenizer files (tokenizer.json, tokenizer_config.json, ...) beside "
                            "the weights; the model cannot be served without its tokenizer")
    requirements = [f"mlflow=={mlflow.__version__}", "torch"]
    if config.get("transformers_version"):
        requirements.append(f"transformers=={config['transformers_version']}")
    files = {
        "MLmodel": yaml.safe_dump(mlmodel(config, name, mlflow.__version__), sort_keys=False),
        "requirements.txt": "\n".join(requirements) + "\n",
        "python_env.yaml": yaml.safe_dump({"python": platform.python_version(), "build_dependencies": ["pip"],
                                           "dependencies": ["-r requirements.txt"]}, sort_keys=False),
    }
    for file_name, text in files.items():
        storage.write_bytes(join_uri(model_uri, file_name), text.encode())
        written.append(file_name)
    return written
