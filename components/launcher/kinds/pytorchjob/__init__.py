"""The PyTorchJob kind: its API coordinates (`api.py`), manifest (`manifest.py`), watch (`watch.py`), and
the `JobKind` implementation (`kind.py`)."""
