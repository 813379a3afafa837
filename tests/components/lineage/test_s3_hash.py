"""Datasets on S3 (a real moto server) are hashed by their bytes, whatever their ETag."""

from __future__ import annotations

import hashlib

from components.lineage.lineage import sha256_of
from tests.integration.conftest import bucket, s3_endpoint, s3_env  # noqa: F401 - fixtures


def test_an_s3_dataset_is_hashed_by_its_content(bucket):  # noqa: F811 - the fixture
    from trainer.storage import get_storage

    data = b'{"prompt": "1+1=", "completion": "2"}\n' * 1000
    uri = f"s3://{bucket}/data/sft.jsonl"
    get_storage(uri).write_bytes(uri, data)
    assert sha256_of(uri) == (hashlib.sha256(data).hexdigest(), len(data))
