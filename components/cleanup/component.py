"""cleanup_jobs: the pipelines' exit handler, deleting whatever jobs (PyTorchJobs, TrainJobs) a run left behind."""

from kfp import dsl

from components.images import LAUNCHER_IMAGE


@dsl.component(base_image=LAUNCHER_IMAGE)
def cleanup_jobs(run_id: str, launcher_mode: str = "kubernetes") -> int:
    """Delete the run's training jobs (labelled alignflow/run) when the run ends, however it ends.

    Args:
        run_id: The pipeline run id.
        launcher_mode: `kubernetes` deletes jobs in this pod's namespace; `local` has none to delete
            (the local launcher stops its processes itself).

    Returns:
        How many jobs were deleted.
    """
    if launcher_mode != "kubernetes":
        return 0
    from components.launcher.follow import launcher as kubernetes
    from components.launcher.settings.platform import PlatformDefaults
    from components.launcher.stage_job import current_namespace, run_label

    deleted = kubernetes.delete_run_jobs(current_namespace(), run_label(run_id),
                                         PlatformDefaults.from_environment().job_kind)
    print(f"deleted {len(deleted)} job(s): {', '.join(deleted) or '-'}")
    return len(deleted)
