"""User-facing errors: a clear message and an exit code, never a traceback.

Every stage raises `PacktrainError` (or a subclass) for bad input; the CLI prints the message and exits with
`exit_code`. Exit codes: 2 bad config/usage, 3 bad input data, 4 validation failed, 5 missing data,
1 regression (gate) / generic failure, 7 the workdir or output directory is in use by another run (retry later),
6 the utilization guard stopped training on an event (telemetry.guard.actions ... checkpoint_and_stop: a checkpoint
of that step is saved, `--resume` continues from it), 8 training diverged (non-finite loss, gradient norm or
weights; the last good checkpoint is kept), 9 no space left on the device an output was being written to (the
message names what, where and how much was free; earlier outputs and checkpoints are kept).
"""

from __future__ import annotations


class PacktrainError(Exception):
    """An error the user can act on. `str(err)` names the file, field or value and what is allowed."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(PacktrainError):
    """A recipe or override is wrong: unknown key, bad type, value out of range."""

    exit_code = 2


class InputDataError(PacktrainError):
    """Input data is unusable: empty, not UTF-8, malformed line, missing column, corrupt file."""

    exit_code = 3


class ValidationFailed(PacktrainError):
    """The Great Expectations suite failed; the message names the failed expectations and the report."""

    exit_code = 4


class MissingDataError(PacktrainError):
    """An expected upstream output or metric does not exist."""

    exit_code = 5


class WorkdirBusy(PacktrainError):
    """Another packtrain process holds the workdir lock; the message names its pid, host, command and start."""

    exit_code = 7


class OutputBusy(WorkdirBusy):
    """Another packtrain process holds the lock of this output directory (`--out`); the message names its pid, host,
    command and start. Exit 7, like a busy workdir."""


class TrainingDiverged(PacktrainError):
    """The loss, gradient norm or weights became non-finite; nothing after the last good checkpoint is saved."""

    exit_code = 8


class DiskFull(PacktrainError):
    """No space left (ENOSPC, a quota) while writing an output: the message names what was being written, where,
    and how much the file system had free; what was written before it (earlier checkpoints) is intact."""

    exit_code = 9


class GuardStopped(PacktrainError):
    """The utilization guard stopped training (action checkpoint_and_stop); the message names the event (step,
    signal, cause) and the checkpoint `--resume` continues from. packtrain.telemetry.guard, docs/guard.md."""

    exit_code = 6


class StageFailed(PacktrainError):
    """A stage of `packtrain run` failed: `cause` is the stage's own error, whose exit code this one carries
    (4 for a failed validation, ...; 1 for a crash that was no PacktrainError); `log` the run's full log.

    >>> e = StageFailed("validate", ValidationFailed("2 expectations failed. Report: /w/report.json"), "/w/run.log")
    >>> e.exit_code, str(e)
    (4, 'stage validate failed: 2 expectations failed. Report: /w/report.json\\n(full log: /w/run.log)')
    """

    def __init__(self, stage: str, cause: BaseException, log: str | None = None):
        self.stage, self.cause, self.log = stage, cause, log
        text = str(cause) if isinstance(cause, PacktrainError) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"stage {stage} failed: {text}" + (f"\n(full log: {log})" if log else ""),
                         exit_code=cause.exit_code if isinstance(cause, PacktrainError) else 1)
