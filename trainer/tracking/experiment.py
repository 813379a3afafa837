"""The MLflow experiment runs are logged under: shared by the trainer's tracker and the lineage component.

Kept apart from `mlflow_tracker.py`, which needs the trainer's runtime (torch): the lineage component runs on the
launcher image, which has no torch.
"""

from __future__ import annotations

from typing import Any


def get_or_create_experiment(client: Any, name: str) -> str:
    """The id of MLflow experiment `name`, created if missing (stage runs and the pipeline's parent run)."""
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)
