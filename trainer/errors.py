"""The error hierarchy: one base class, one subclass per domain.

Every message says where the problem is (file:line, dotted key, URI or flag), what was found and
what was expected, so a user can fix the input without reading a traceback.
"""


class AlignflowError(Exception):
    """Base class of every error alignflow raises on purpose."""


class ConfigError(AlignflowError):
    """A config file, a `--set` override or a flag is invalid."""


class DataError(AlignflowError):
    """A dataset file or one of its rows is invalid."""


class CheckpointError(AlignflowError):
    """A checkpoint is missing, incomplete or does not match the run."""


class StorageError(AlignflowError):
    """A storage URI cannot be read or written."""


class LaunchError(AlignflowError):
    """A training job could not be launched or failed."""


class PipelineError(AlignflowError):
    """A pipeline could not be compiled, submitted or run."""


class WaitTimeout(AlignflowError):
    """Something another process should produce (experience, a weight version) did not arrive in time."""


class RewardError(AlignflowError):
    """A reward function raised, ran past its timeout, or returned something other than a finite number."""


class TrainingError(AlignflowError):
    """Training diverged (non-finite losses, gradients or weights) and the run was stopped."""


class LeaseError(AlignflowError):
    """Another live run holds the output directory."""


class RunFinished(AlignflowError):
    """The output directory already holds a finished run: nothing to do (exit status 0)."""

    exit_code = 0
