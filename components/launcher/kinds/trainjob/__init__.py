"""The TrainJob kind: its API coordinates (`api.py`), what the Kubeflow SDK is asked to create
(`request.py`), and the `JobKind` implementation through the SDK (`kind.py`)."""
