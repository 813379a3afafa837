"""URI schemes: which backend serves which URI, and how S3-style URIs split."""

from __future__ import annotations

import pytest

from trainer.errors import StorageError
from trainer.storage import get_storage, is_remote
from trainer.storage.s3 import split_uri


@pytest.mark.parametrize(("uri", "expected"), [("s3://bucket/a/b.json", ("bucket", "a/b.json")),
                                               ("minio://mlpipeline/v2/artifacts/x", ("mlpipeline", "v2/artifacts/x")),
                                               ("s3://bucket", ("bucket", ""))])
def test_s3_and_kfp_minio_uris_split_into_bucket_and_key(uri, expected):
    assert is_remote(uri)
    assert split_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3:/bucket/key", "minio:///key", "s3://"])
def test_malformed_s3_uris_are_refused_naming_them(uri):
    with pytest.raises(StorageError, match="expected s3://bucket/key"):
        split_uri(uri)


def test_another_scheme_is_one_error_naming_it():
    with pytest.raises(StorageError, match="unsupported URI scheme gs://"):
        get_storage("gs://bucket/key")
