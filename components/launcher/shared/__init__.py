"""Pieces the launcher's rooms (and the `alignflow` CLI) share: retrying transient API failures (`retry.py`),
Kubernetes quantities (`quantities.py`)."""
