"""A stand-in for Kubeflow Trainer's S3 model and dataset initializers, for the emulated cluster.

It reads what the real ones read (`pkg/initializers/utils/utils.py` `get_config_from_env`, kubeflow/trainer at
8c0f5059): STORAGE_URI, IGNORE_PATTERNS (comma-separated), ENDPOINT, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION; and
fetches as `utils/opendal.py` `S3Storage.download` does: every key under the URI as a prefix, skipping keys an
ignore pattern matches (fnmatch on the whole key), each written to its path relative to the prefix (a key equal to
the prefix keeps its file name). boto3 stands in for OpenDAL. ROLE_ARN is not emulated; hf:// (the Hub initializers)
cannot be fetched here and fails, saying so; any other scheme fails as the real one does.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from pathlib import Path
from urllib.parse import urlparse


def main(destination: str, what: str) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)-8s %(message)s", level=logging.INFO)
    logging.info("Starting %s initialization", what)
    storage_uri = os.environ.get("STORAGE_URI")
    if not storage_uri:
        raise ValueError("STORAGE_URI environment variable must be set")
    parsed = urlparse(storage_uri)
    if parsed.scheme == "hf":
        raise SystemExit(f"{storage_uri}: the emulated cluster cannot fetch from the Hugging Face Hub")
    if parsed.scheme != "s3":
        raise ValueError(f"Unsupported storage URI scheme {parsed.scheme!r}")
    import boto3

    env = {name: os.environ.get(name) or None for name in ("ENDPOINT", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION")}
    client = boto3.client("s3", endpoint_url=env["ENDPOINT"], region_name=env["REGION"] or "us-east-1",
                          aws_access_key_id=env["ACCESS_KEY_ID"], aws_secret_access_key=env["SECRET_ACCESS_KEY"])
    ignore = [item.strip() for item in os.environ.get("IGNORE_PATTERNS", "").split(",") if item.strip()]
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
    logging.info("Downloading files from S3 bucket: %s, prefix: %s", bucket, prefix)
    target = Path(destination)
    target.mkdir(parents=True, exist_ok=True)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            if key.endswith("/"):
                continue
            if any(fnmatch.fnmatch(key, pattern) for pattern in ignore):
                logging.info("Skipping ignored file: %s", key)
                continue
            path = target / (key[len(prefix):].lstrip("/") or Path(key).name)
            path.parent.mkdir(parents=True, exist_ok=True)
            logging.info("Downloading %s to %s", key, path)
            client.download_file(bucket, key, str(path))
    logging.info("Files have been downloaded")
