"""The TrainJob kind: its API coordinates (`api.py`), what the Kubeflow SDK is asked to create
(`request.py`), the `JobKind` implementation through the SDK (`kind.py`), and the same TrainJob as the
arguments of a user's own `TrainerClient.train` call, without KFP (`sdk_call.py`)."""
