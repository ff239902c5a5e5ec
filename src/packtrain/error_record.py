"""The error record: a PacktrainError crossing a process boundary.

One format, one writer, one reader, for the two places where a stage runs in a child process and its error
must come back with its message and exit code: a KFP component under `packtrain run --runner kfp`
(PACKTRAIN_ERROR_FILE, packtrain.pipeline.runtime) and rank 0 of a torchrun launch (packtrain.train.launch).
The in-process runner needs none: the exception itself comes back.

    {"stage": "validate", "message": "...", "exit_code": 4, "type": "ValidationFailed"}
"""

from __future__ import annotations

from packtrain import errors
from packtrain.errors import PacktrainError

ERROR_FILE_ENV = "PACKTRAIN_ERROR_FILE"
"""The file a child process writes its error record to (set by the process that waits for it)."""


def write_error_record(path: str | None, err: PacktrainError, stage: str | None = None) -> None:
    """{"stage", "message" (credentials redacted), "exit_code", "type"} as JSON at `path` (nothing when None)."""
    if not path:
        return
    from pathlib import Path

    from packtrain.publish import write_json
    from packtrain.secrets import redact_text

    write_json(Path(path), {"stage": stage, "message": redact_text(str(err)), "exit_code": err.exit_code,
                            "type": type(err).__name__})


def read_error_record(path) -> tuple[PacktrainError, str | None] | None:
    """The error a child process recorded at `path` (its class when packtrain.errors has it, else a PacktrainError
    with its exit code) and the stage it names; None when there is no readable record."""
    import json
    from pathlib import Path

    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(rec, dict):
        return None
    cls = getattr(errors, str(rec.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, PacktrainError)):
        cls = PacktrainError
    try:
        code = int(rec.get("exit_code", 1))
    except (TypeError, ValueError):
        code = 1
    return cls(str(rec.get("message", "")), exit_code=code), rec.get("stage")
