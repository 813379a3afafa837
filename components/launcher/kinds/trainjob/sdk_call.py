"""The arguments of a Kubeflow SDK `TrainerClient.train` call that runs one alignflow stage, without KFP.

A notebook or a CI job that holds a stage config in S3 runs the stage on alignflow's runtime (the chart's
TrainingRuntime or ClusterTrainingRuntime) with the SDK's own client:

    client.train(runtime="af-alignflow-torch", **stage_trainjob_arguments("sft", "s3://b/sft.yaml", cluster,
                                                                          name="my-sft"))

The trainer and options come from the launcher's own `build_trainjob_request`, so the TrainJob is the one a
stage component creates (command, env, the S3 Secret as a volume, /dev/shm, security contexts, grace period;
see `request.py`). What it leaves out, because a component does it around the job: writing the config to
`config_uri` (the caller uploads it first), following the job (the SDK's `wait_for_job_status`), reading
`final_metrics.json`, and the platform's allow-lists of images and Secrets (the chart's ConfigMap, which a
component reads and the SDK does not).

Where the runtime has Kubeflow Trainer's initializers (the chart's `training.initializers.enabled`) and
`cluster.initializers` is on, `stage_initializers` gives the config to upload (its `model.path` and `data.*` naming
the copies under /workspace) and the `initializer` to pass here:

    config, initializer = stage_initializers(config, cluster, "TrainJob")   # upload this config
    client.train(runtime="af-alignflow-torch", **stage_trainjob_arguments("dpo", "s3://b/dpo.yaml", cluster,
                                                                          name="my-dpo", initializer=initializer))
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from components.launcher.kinds.trainjob.request import build_trainjob_request
from components.launcher.stage_job import stage_initializers, stage_spec

__all__ = ["stage_initializers", "stage_trainjob_arguments"]

if TYPE_CHECKING:
    from components.launcher.stage_job import ClusterOptions


def stage_trainjob_arguments(stage: str, config_uri: str, cluster: ClusterOptions, *, name: str,
                             config: dict | None = None, initializer: dict | None = None) -> dict[str, Any]:
    """`trainer` and `options` for `TrainerClient.train` that run `python -m trainer <stage> --config <config_uri>`.

    Args:
        stage: The stage to run (`sft`, `rm`, `dpo`, ...), as `python -m trainer` names it.
        config_uri: Where the stage config is (`s3://...`); the pods read it from there.
        cluster: Image, namespace, nodes, processes, resources, S3 Secret and plain env of the job
            (`ClusterOptions`; its `namespace` must be the `TrainerClient`'s).
        name: The TrainJob's name (DNS-1035, as a Job's); the stage's MLflow run is tagged with it too.
        config: The stage config, when at hand: its `checkpoint.preemption_grace_seconds` sets the pods'
            grace period (else the default config's).
        initializer: The TrainJob's `spec.initializer` from `stage_initializers` (what the runtime's model and
            dataset initializers fetch); None fetches nothing.

    Returns:
        `{"trainer": CustomTrainerContainer, "options": [...], "initializer": Initializer or None}`, to pass as
        `train(runtime=..., **arguments)`.

    Raises:
        LaunchError: The job's values are invalid (every problem named, before anything is created).
    """
    spec = replace(stage_spec(stage, config_uri, name, stage, cluster, config=config, initializer=initializer),
                   name=name)
    request = build_trainjob_request(spec)
    return {"trainer": request.trainer, "options": request.options, "initializer": request.initializer}
