"""Following a job on Kubernetes to its end: create or re-attach, follow its phase through the kind,
report stuck pods, copy the trainer's log, delete it when it ends or the task is cancelled
(`launcher.py`); looking at its pods (`pods.py`)."""
