"""fingerprint_inputs: a hash of the inputs' content, so caching follows content, not URIs."""

from kfp import dsl

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def fingerprint_inputs(uris: list) -> str:
    """Hash what the given URIs hold now (ETags on S3; size and mtime locally).

    Never cached itself: a weekly retrain of `s3://.../latest` gets a new fingerprint when the
    data changed, and `prepare_inputs`, cached on that fingerprint, copies the new data.

    Args:
        uris: Dataset and model URIs (local, s3:// or minio://); empty strings are skipped.

    Returns:
        A hex SHA-256 of the URIs and their ETags.
    """
    from components.prepare.inputs import content_fingerprint

    return content_fingerprint([str(uri) for uri in uris])
