"""The keys of the Kubernetes Secrets a run reads, named once.

A key is also the name of the environment variable it becomes in a pod (`secretKeyRef`, or a file of
a mounted Secret that `trainer.launch` exports), so these names serve the launcher (the job's env),
the pipelines (each component pod's env), the sandbox (its token variable) and redaction (the values
never printed). `SECRET_DIRS_VARIABLE` is not a key but the one variable that lists where a TrainJob's Secret
files are mounted. The reward server's and the reward sources' token variables are the user's to name
(`--token-env`, `service.token_env`).
"""

S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MLFLOW_SECRET_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
SANDBOX_TOKEN_VARIABLE = "ALIGNFLOW_SANDBOX_TOKEN"  # the sandbox service's token, on both sides
# The folders of a TrainJob's mounted Secrets, `:`-separated: the launcher sets it, `trainer.launch` exports their
# files as variables, and the local sandbox keeps them out of the code it runs.
SECRET_DIRS_VARIABLE = "ALIGNFLOW_SECRET_ENV_DIRS"
