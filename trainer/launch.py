"""`python -m trainer.launch [torchrun options] -m trainer <stage> --config ...`: torchrun, with the preemption status.

What a PyTorchJob's container runs instead of bare `torchrun`. It is torchrun itself (the same
options, `PET_*` variables and elastic agent, run in this process); only its exit status differs
when the run was stopped by a signal:

- The agent got SIGTERM or SIGINT (Kubernetes sends SIGTERM to the container's first process when
  it evicts or deletes a pod): the agent forwards the signal to its workers and waits for them up
  to its shutdown timeout (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, which the manifest sets to the pod's
  grace period, so it never cuts the workers' stopping checkpoint short). The workers stop at a
  step boundary with a checkpoint and exit 128 + signal; torchrun would then exit 1, a "general
  error" that the Training Operator's `ExitCode` restart policy treats as permanent. Here the exit
  status is 128 + signal (143 for SIGTERM, 130 for SIGINT), which that policy retries.
- The workers stopped on their own because of a signal (a signal sent to them rather than to the
  agent): a failed worker exited 143 or 130, and every other one did too or was stopped by the
  agent's own SIGTERM after it. The status is the preempted worker's.

Any other failure is torchrun's, unchanged (its error report, exit 1).

Before torchrun starts, the variables a TrainJob's Secrets hold are exported from their files: a
TrainJob cannot take env from Secrets (the Kubeflow SDK passes plain values only, and Kubeflow
Trainer refuses env in runtime patches of its `node` container), so the launcher mounts each Secret
read-only with only the keys used, each as a file named after its variable, and lists the folders
in `ALIGNFLOW_SECRET_ENV_DIRS` (components/launcher/kinds/trainjob/request.py). torchrun's workers inherit
them as a PyTorchJob's pods get them through `secretKeyRef`. A folder that does not exist (an
optional Secret that is absent) is skipped.

What this leaves out: the agent does not report its workers' exit statuses when it is the one
signalled, so in that case the status says that the job was stopped by the signal, not that every
worker finished its checkpoint; a rerun resumes from the newest complete checkpoint either way (a
worker that ran out of `checkpoint.preemption_grace_seconds` leaves the previous one in charge).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import MutableMapping
from pathlib import Path

from trainer.secret_keys import SECRET_DIRS_VARIABLE

# Worker exit statuses that mean "stopped by this signal at a step boundary" (trainer.lifecycle.preemption).
PREEMPTED = {128 + signal.SIGTERM, 128 + signal.SIGINT}
# How torchrun reports a worker that its own shutdown signalled: once the first worker exits 143, the
# agent sends SIGTERM to the rest, and one that had already left its handler (it saved too and was
# exiting) dies of it.
STOPPED_BY_AGENT = {-signal.SIGTERM, -signal.SIGINT}


_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a Secret volume's `..data` links are not variables


def export_secret_files(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Set each variable held as a file in the folders `ALIGNFLOW_SECRET_ENV_DIRS` names; returns their names."""
    exported = []
    for folder in filter(None, environ.get(SECRET_DIRS_VARIABLE, "").split(":")):
        if not Path(folder).is_dir():
            continue
        for item in sorted(Path(folder).iterdir()):
            if _VARIABLE_NAME.match(item.name) and item.is_file():
                environ[item.name] = item.read_text()
                exported.append(item.name)
    return exported


def preempted_status(statuses: list[int]) -> int | None:
    """The job's status when its failed workers were preempted (143 or 130), else None (a real failure)."""
    if any(status not in PREEMPTED | STOPPED_BY_AGENT for status in statuses):
        return None
    return next((status for status in statuses if status in PREEMPTED), None)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (default: this process's arguments) and return the job's exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from trainer.lifecycle.collector import freeze_at_exit

    freeze_at_exit()  # the agent imported torch: its last collection at exit costs about a second
    export_secret_files()
    try:
        torchrun(argv)
    except SignalException as err:
        status = 128 + int(err.sigval)
        print(f"torchrun: stopped by {signal.Signals(err.sigval).name}, forwarded to the workers; exit status "
              f"{status} (preempted: rerun to resume from the newest checkpoint)", file=sys.stderr)
        return status
    except ChildFailedError as err:
        status = preempted_status([failure.exitcode for failure in err.failures.values()])
        if status is None:
            raise
        print(f"torchrun: the workers were stopped by a signal; exit status {status} (preempted: "
              "rerun to resume)", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
