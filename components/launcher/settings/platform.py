"""The platform's defaults and policy, read once from the component pod's environment.

The chart's defaults ConfigMap provides these variables to the component's pod; each is optional.
The pod options' variables (`ALIGNFLOW_NODE_SELECTOR`, `ALIGNFLOW_CPU_REQUEST`, `ALIGNFLOW_JOB_KIND`,
`ALIGNFLOW_S3_SECRET`, ...) are declared with their options in `options.py` and checked in
`scheduling.py` (a bad value is an error naming the variable, which is also the ConfigMap key). The
others:

| variable | meaning |
|---|---|
| `ALIGNFLOW_TRAINER_IMAGE` | trainer image when the component is not given one |
| `ALIGNFLOW_TRAINER_VLLM_IMAGE` | the same for a stage whose `rollout.engine` is `vllm` or `auto` (the image's vLLM variant) |
| `AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION` | passed to the job as plain environment |
| `MLFLOW_TRACKING_URI` | passed to the job without any `user:password@` it carries |
| `ALIGNFLOW_S3_RETRY_SECONDS` | how long S3 calls ride out an outage; passed on to the job |
| `ALIGNFLOW_REWARD_FUNCTIONS`, `ALIGNFLOW_ENVIRONMENTS`, `ALIGNFLOW_TOOLS` and their `ALIGNFLOW_ALLOWED_*_MODULES` | the names a run may load (`trainer/allow_list.py`); passed on to the job, which resolves them |
| `ALIGNFLOW_ALLOWED_IMAGES` | comma-separated trainer images or registry/repository prefixes a job may run |
| `ALIGNFLOW_ALLOWED_SECRETS` | comma-separated Secret names a job may read S3 credentials from |

Allow-lists (checked before any job is created, in both launcher modes):

- An image is allowed when it equals an entry, or starts with it followed by `:` (a tag), `@` (a
  digest) or `/` (a repository under a registry or path prefix); an entry ending in `/` allows
  everything below it. `ghcr.io/acme/trainer` allows `ghcr.io/acme/trainer:1.2` but not
  `ghcr.io/acme/trainer-evil:1`.
- When `ALIGNFLOW_ALLOWED_IMAGES` is unset or empty, only `ALIGNFLOW_TRAINER_IMAGE` is allowed
  when that is set, and any image when neither is set (a laptop, or a cluster without the chart).
- When `ALIGNFLOW_ALLOWED_SECRETS` is unset or empty, only `ALIGNFLOW_S3_SECRET` is allowed when
  that is set, and any Secret when neither is set. A job without an S3 Secret is always allowed.

Credentials never enter a manifest as plain values: the tracking URI's user-info is dropped, and
the job reads the credentials from `ALIGNFLOW_MLFLOW_SECRET` through secretKeyRefs; a URI with a
user-info and no such Secret is an error (naming the variables, never the credentials).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.launcher.settings.scheduling import options_from_environment
from trainer.allow_list import ALLOW_LIST_VARIABLES
from trainer.errors import LaunchError

# Passed to the job as plain environment (after the tracking URI loses its credentials). The allow-lists too: the
# trainer resolves reward functions, environments and tools in the job's pods.
JOB_ENV_NAMES = ("MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "ALIGNFLOW_PARENT_RUN_ID",
                 "ALIGNFLOW_S3_RETRY_SECONDS", *ALLOW_LIST_VARIABLES)


@dataclass(kw_only=True, slots=True)
class PlatformDefaults:
    """What the platform's environment says; empty values mean "not configured"."""

    trainer_image: str = ""
    trainer_vllm_image: str = ""
    allowed_images: list[str] | None = None
    """None allows any image."""
    allowed_secrets: list[str] | None = None
    """None allows any Secret."""
    job_env: dict[str, str] = field(default_factory=dict)
    """Plain environment for the job, free of credentials."""
    options: dict[str, Any] = field(default_factory=dict)
    """The pod options the platform's variables set (`settings/options.py`), checked; unset ones are absent."""

    @property
    def job_kind(self) -> str:
        """The platform's job kind setting (`auto` when unset)."""
        return self.options.get("job_kind", "auto")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> PlatformDefaults:
        """Read the variables from `environ` (default: this process). Raises LaunchError naming a bad one."""
        environ = os.environ if environ is None else environ
        options = options_from_environment(environ)
        job_env = {name: environ[name].strip() for name in JOB_ENV_NAMES if environ.get(name, "").strip()}
        if "ALIGNFLOW_S3_RETRY_SECONDS" in job_env:
            _check_retry_seconds(job_env["ALIGNFLOW_S3_RETRY_SECONDS"])
        if "MLFLOW_TRACKING_URI" in job_env:
            uri, has_credentials = strip_credentials(job_env["MLFLOW_TRACKING_URI"])
            if has_credentials and not options.get("mlflow_secret"):
                raise LaunchError(f"MLFLOW_TRACKING_URI ({uri}) carries credentials, and ALIGNFLOW_MLFLOW_SECRET "
                                  "names no Secret to pass it through; put MLFLOW_TRACKING_USERNAME and "
                                  "MLFLOW_TRACKING_PASSWORD in a Secret and name it in ALIGNFLOW_MLFLOW_SECRET")
            job_env["MLFLOW_TRACKING_URI"] = uri
        return cls(trainer_image=environ.get("ALIGNFLOW_TRAINER_IMAGE", "").strip(),
                   trainer_vllm_image=environ.get("ALIGNFLOW_TRAINER_VLLM_IMAGE", "").strip(),
                   allowed_images=_allow_list(environ, "ALIGNFLOW_ALLOWED_IMAGES", "ALIGNFLOW_TRAINER_IMAGE"),
                   allowed_secrets=_allow_list(environ, "ALIGNFLOW_ALLOWED_SECRETS", "ALIGNFLOW_S3_SECRET"),
                   job_env=job_env, options=options)


def _check_retry_seconds(text: str) -> None:
    try:
        ok = float(text) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise LaunchError(f"ALIGNFLOW_S3_RETRY_SECONDS (ConfigMap key) is {text!r}, expected a number of seconds >= 0")


def _allow_list(environ: Mapping[str, str], name: str, fallback: str) -> list[str] | None:
    entries = [item.strip() for item in environ.get(name, "").split(",") if item.strip()]
    if entries:
        return entries
    return [environ[fallback].strip()] if environ.get(fallback, "").strip() else None


def strip_credentials(uri: str) -> tuple[str, bool]:
    """`uri` without any `user[:password]@`, and whether it carried any (a bare user may be a token)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, False
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), True


def is_image_allowed(image: str, allowed: list[str] | None) -> bool:
    if allowed is None:
        return True
    for entry in allowed:
        if image == entry or (entry.endswith("/") and image.startswith(entry)):
            return True
        if image.startswith(entry) and image[len(entry)] in ":@/":
            return True
    return False


def check_allowed(image: str, s3_secret: str, allowed_images: list[str] | None,
                  allowed_secrets: list[str] | None) -> None:
    """Refuse an image or an S3 Secret the platform does not allow. Raises LaunchError."""
    if not is_image_allowed(image, allowed_images):
        raise LaunchError(f"trainer image {image!r} is not allowed on this platform; allowed images "
                          f"(ALIGNFLOW_ALLOWED_IMAGES, else ALIGNFLOW_TRAINER_IMAGE): {', '.join(allowed_images)}")
    if s3_secret and allowed_secrets is not None and s3_secret not in allowed_secrets:
        raise LaunchError(f"S3 Secret {s3_secret!r} is not allowed on this platform; allowed Secrets "
                          f"(ALIGNFLOW_ALLOWED_SECRETS, else ALIGNFLOW_S3_SECRET): {', '.join(allowed_secrets)}")
