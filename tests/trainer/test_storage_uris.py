"""URI schemes: which backend serves which URI, and how S3-style URIs split."""

from __future__ import annotations

import pytest

from trainer.errors import StorageError
from trainer.storage import get_storage, is_remote
from trainer.storage.local import directory_problem, local_path
from trainer.storage.s3 import split_uri
from trainer.storage.transfer import cached_copy


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


@pytest.mark.parametrize("read", [get_storage, local_path, cached_copy])
def test_another_scheme_is_one_error_naming_it_never_a_local_path(read):
    with pytest.raises(StorageError, match=r"^gs://bucket/key: unsupported URI scheme gs://; expected a local path"):
        read("gs://bucket/key")


def test_a_directory_cannot_be_a_file_or_lie_below_one(tmp_path):
    (tmp_path / "file").write_text("x")
    assert directory_problem(tmp_path / "file") == f"{tmp_path / 'file'} is a file, expected a directory"
    assert directory_problem(f"file://{tmp_path}/file/run") == \
        f"{tmp_path / 'file'} is a file, so {tmp_path / 'file' / 'run'} cannot be a directory below it"
    assert directory_problem(tmp_path / "new" / "run") is None and directory_problem(tmp_path) is None
