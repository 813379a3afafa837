"""Pieces the launcher's rooms share: the retry policy for the Kubernetes API (`retry.py`, over `trainer.http`'s),
Kubernetes quantities (`quantities.py`)."""
