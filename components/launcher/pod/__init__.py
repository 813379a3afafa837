"""The spec of a stage's job and the pod every replica runs, whatever the job's kind.

- `spec.py`: `JobSpec` (everything that decides one stage's job), `SecretEnv`, the job name and labels;
- `template.py`: the pod (container, command, resources, placement, security, /dev/shm);
- `checks.py`: the checks of a spec's values that the job CRDs' schemas do not make.
"""
