"""User-facing errors: a clear message and an exit code, never a traceback.

Every stage raises `PacktrainError` (or a subclass) for bad input; the CLI prints the message and exits with
`exit_code`. Exit codes: 2 bad config/usage, 3 bad input data, 4 validation failed, 5 missing data,
1 regression (gate) / generic failure, 7 the workdir is in use by another run (retry later),
8 training diverged (non-finite loss, gradient norm or weights; the last good checkpoint is kept).
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


class TrainingDiverged(PacktrainError):
    """The loss, gradient norm or weights became non-finite; nothing after the last good checkpoint is saved."""

    exit_code = 8


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


# -- the error record: a PacktrainError crossing a process boundary ------------------------------------------
# One format, one writer, one reader, for the two places where a stage runs in a child process and its error
# must come back with its message and exit code: a KFP component under `packtrain run --runner kfp`
# (PACKTRAIN_ERROR_FILE, packtrain.pipeline.runtime) and rank 0 of a torchrun launch (packtrain.train.launch).
# The in-process runner needs none: the exception itself comes back.

ERROR_FILE_ENV = "PACKTRAIN_ERROR_FILE"
"""The file a child process writes its error record to (set by the process that waits for it)."""


def write_error_record(path: str | None, err: PacktrainError, stage: str | None = None) -> None:
    """{"stage", "message" (credentials redacted), "exit_code", "type"} as JSON at `path` (nothing when None)."""
    if not path:
        return
    from pathlib import Path

    from packtrain.paths import write_json
    from packtrain.secrets import redact_text

    write_json(Path(path), {"stage": stage, "message": redact_text(str(err)), "exit_code": err.exit_code,
                            "type": type(err).__name__})


def read_error_record(path) -> tuple[PacktrainError, str | None] | None:
    """The error a child process recorded at `path` (its class when this module has it, else a PacktrainError
    with its exit code) and the stage it names; None when there is no readable record."""
    import json
    from pathlib import Path

    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(rec, dict):
        return None
    cls = globals().get(str(rec.get("type")))
    if not (isinstance(cls, type) and issubclass(cls, PacktrainError)):
        cls = PacktrainError
    try:
        code = int(rec.get("exit_code", 1))
    except (TypeError, ValueError):
        code = 1
    return cls(str(rec.get("message", "")), exit_code=code), rec.get("stage")
