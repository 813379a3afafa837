"""The launcher: build a stage's job (a PyTorchJob or a TrainJob), run it on Kubernetes or locally.

The rooms, by concern:

- `stage_job.py`: what a stage component calls (`components/stage_io.py`, above this package: KFP inputs
  -> stage config and cluster options) to run one job to its final metrics;
- `settings/`: the pod/platform options, declared once, and where their values come from (the
  platform's environment, a run's `scheduling` parameter);
- `pod/`: the spec of a stage's job, whatever its kind, the pod every replica runs, and its checks;
- `kinds/`: the job kinds behind one interface (`kinds/interface.py`): PyTorchJob, TrainJob, and
  the choice between them;
- `follow/`: following a job on Kubernetes to its end (its pods, its log, cancellation);
- `local/`: running the PyTorchJob manifest as local processes;
- `shared/`: pieces the others use (retrying transient API failures).

This package imports nothing itself, so importing one room never loads the others.
"""
