"""Run-time checks for features that need newer releases than the floors in pyproject.toml.

The floors admit ColossalAI 0.5.0's pins (torch 2.5.1, transformers 4.51.3), so its virtualenv and
image variant can install this project. A feature that needs something newer asks here, and its
config or plugin fails with one line that names the key, the version found and the version needed.
This module only reads installed package versions; it imports neither torch nor transformers.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.version import Version

PACKING_TRANSFORMERS = "4.56"
"""Padding-free packing (`sft.packing`): older transformers ignore restarting `position_ids` under
sdpa/eager attention, so packed samples would attend to each other (measured with 4.51.3)."""

DTYPE_KEYWORD_TRANSFORMERS = "4.56"
"""`from_pretrained(dtype=...)`; older releases call it `torch_dtype`."""

FSDP2_TORCH = "2.6"
"""`parallel.plugin: fsdp2`: `torch.distributed.fsdp.fully_shard` is public from torch 2.6."""


def installed_version(package: str) -> Version | None:
    """The installed version of `package`, or None when it is not installed."""
    try:
        return Version(version(package))
    except PackageNotFoundError:
        return None


def has_at_least(package: str, minimum: str) -> bool:
    """Whether `package` is installed at `minimum` or newer (local suffixes like `+cpu` are ignored)."""
    found = installed_version(package)
    return found is not None and Version(found.base_version) >= Version(minimum)


def missing_requirement(package: str, minimum: str) -> str | None:
    """None when `package>=minimum` is installed, else why not, as a phrase ("needs X>=m; this environment has ...")."""
    if has_at_least(package, minimum):
        return None
    found = installed_version(package)
    return f"needs {package}>={minimum}; this environment has {package} {found or '(not installed)'}"


def dtype_keyword(dtype: Any) -> dict[str, Any]:
    """`from_pretrained`'s dtype argument: `dtype` from transformers 4.56, `torch_dtype` before it."""
    return {"dtype": dtype} if has_at_least("transformers", DTYPE_KEYWORD_TRANSFORMERS) else {"torch_dtype": dtype}
