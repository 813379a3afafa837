"""One storage interface over local paths (and `file://`) and `s3://bucket/prefix`.

`get_storage(uri)` picks the backend from the URI. Code that reads or writes datasets,
checkpoints, models or experience goes through it and never imports boto3 itself.
"""

from trainer.storage.base import Storage, is_remote, join_uri
from trainer.storage.factory import get_storage

__all__ = ["Storage", "get_storage", "is_remote", "join_uri"]
