"""Running a stage's PyTorchJob manifest on this machine as local processes, as the operator would (`runner.py`)."""
