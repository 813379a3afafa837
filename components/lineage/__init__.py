"""The lineage components: the pipeline run's MLflow parent run, opened first and closed last."""
