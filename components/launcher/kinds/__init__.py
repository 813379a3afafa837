"""The kinds of training job: one interface (`interface.py`), one sub-package per kind, and the choice.

- `pytorchjob/`: `kubeflow.org/v1` PyTorchJobs (the Training Operator v1);
- `trainjob/`: `trainer.kubeflow.org/v1alpha1` TrainJobs (Kubeflow Trainer v2, through the Kubeflow SDK);
- `choice.py`: which kind a stage runs as (the platform's setting, checked against what the cluster
  serves); it builds the kinds, so the interface never imports an implementation.

Each kind's API coordinates (group, version, plural, kind) are declared once, in its `api.py`.
"""
