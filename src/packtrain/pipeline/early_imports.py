"""Import what the training stage needs while the stages before it run: `packtrain run` starts this first.

A scheduled retrain restores ingest … pack from the stage cache in well under a second, so its train stage used to
begin with ~10 s of first imports (torch, transformers, the model and loop modules) on a GPU host, with the GPU
waiting; a first run pays the same imports inside tokenize. Imported on a daemon thread from the start of the run,
they overlap the MLflow parent run's creation, the stage-cache lookups and the data stages' own work.

Only imports, never CUDA: the train stage sets the allocator's environment before anything touches the device
(packtrain.train.techniques.set_allocator_env). A stage that imports a module the thread is still importing waits
for it (Python's per-module import lock) and then finds it complete. A failed import is left for the stage that
needs the module to raise in its own words.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Callable, Sequence


def import_model_stack() -> None:
    """What the train and evaluate stages import first (transformers loads its model machinery on
    first attribute access: `import transformers` alone is not it)."""
    import torch  # noqa: F401
    import transformers.masking_utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import packtrain.evaluate.loading  # noqa: F401
    import packtrain.model.build  # noqa: F401
    import packtrain.train.session  # noqa: F401


def import_compiler() -> None:
    """… with train.compile (inductor's import is seconds of its own)."""
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401


def import_fused_loss() -> None:
    """… with train.loss fused (optional: absent → the loss falls back, and so does this)."""
    import liger_kernel.transformers.fused_linear_cross_entropy  # noqa: F401


def early_imports(cfg) -> tuple[Callable[[], None], ...]:
    """The imports `cfg`'s train stage will make, as functions that make them (module doc).

    >>> from packtrain.config import load_run_config
    >>> [f.__name__ for f in early_imports(load_run_config("350m-h200"))]
    ['import_model_stack', 'import_compiler', 'import_fused_loss']
    """
    return ((import_model_stack,) + ((import_compiler,) if cfg.train.compile else ())
            + ((import_fused_loss,) if cfg.train.loss == "fused" else ()))


def worth_importing_early(cfg) -> bool:
    """Only where the imports overlap work the GPU would otherwise wait for: a recipe that trains on CUDA, on a host
    with an NVIDIA device. On a CPU host the imports would only compete with the data stages for the same cores
    (and with a run that fails early, for nothing).

    >>> from packtrain.config import load_run_config
    >>> worth_importing_early(load_run_config("tiny-cpu"))
    False
    """
    import os

    return cfg.train.device != "cpu" and os.path.exists("/dev/nvidiactl")


def start_early_imports(imports: Sequence[Callable[[], None]]) -> threading.Thread | None:
    """Call each of `imports` on a daemon thread (module doc); returns the started thread (None: nothing to
    import). One that fails to import is skipped, the next one still runs. What the imports print (a library's
    logging or warnings) is kept, not shown: the stages' own imports print into the run's log, and so must these
    (`drain`)."""
    if not imports:
        return None

    def work() -> None:
        for run_imports in imports:
            with contextlib.suppress(Exception):   # the stage that needs it raises with its own message
                run_imports()

    t = threading.Thread(target=work, name=THREAD_NAME, daemon=True)
    for attr in ("stdout", "stderr"):
        current = getattr(sys, attr)
        if not isinstance(current, _ThreadRouted):
            setattr(sys, attr, _ThreadRouted(current))
    t.start()
    return t


def drain(log) -> None:
    """Write what the import thread printed so far into `log` (the run's log)."""
    with _LOCK:
        text = _KEPT.getvalue()
        _KEPT.seek(0)
        _KEPT.truncate()
    if text:
        log.write(text)


THREAD_NAME = "packtrain-early-imports"
_KEPT = io.StringIO()
_LOCK = threading.Lock()


class _ThreadRouted(io.TextIOBase):
    """sys.stdout/sys.stderr as they were, except for writes made on the import thread: those are kept for the
    log (`drain`). A stage's own redirection replaces this object while the stage runs and puts it back after."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def write(self, s: str) -> int:
        if threading.current_thread().name == THREAD_NAME:
            with _LOCK:
                return _KEPT.write(s)
        return self._wrapped.write(s)

    def flush(self) -> None:
        self._wrapped.flush()

    def __getattr__(self, name):   # fileno, encoding, isatty, buffer …: the wrapped stream's
        return getattr(self._wrapped, name)
