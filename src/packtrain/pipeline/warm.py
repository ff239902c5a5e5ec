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

import importlib
import io
import sys
import threading

MODULES = ("torch", "transformers", "transformers.modeling_utils", "transformers.masking_utils",
           "transformers.models.llama.modeling_llama", "packtrain.model.build", "packtrain.train.session",
           "packtrain.evaluate.loading")
"""What the train and evaluate stages import first, heaviest first (transformers loads its model machinery on
first attribute access: `import transformers` alone is not it)."""
COMPILE_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")
"""… with train.compile (inductor's import is seconds of its own)."""
FUSED_LOSS_MODULES = ("liger_kernel.transformers.fused_linear_cross_entropy",)
"""… with train.loss fused (optional: absent → the loss falls back, and so does this)."""


def warm_modules(cfg) -> tuple[str, ...]:
    """The modules `cfg`'s train stage will import (module doc).

    >>> from packtrain.config import load_run_config
    >>> warm_modules(load_run_config("350m-h200"))[-3:]
    ('torch._dynamo', 'torch._inductor.compile_fx', 'liger_kernel.transformers.fused_linear_cross_entropy')
    """
    return (MODULES + (COMPILE_MODULES if cfg.train.compile else ())
            + (FUSED_LOSS_MODULES if cfg.train.loss == "fused" else ()))


def worth_warming(cfg) -> bool:
    """Only where the imports overlap work the GPU would otherwise wait for: a recipe that trains on CUDA, on a host
    with an NVIDIA device. On a CPU host the imports would only compete with the data stages for the same cores
    (and with a run that fails early, for nothing).

    >>> from packtrain.config import load_run_config
    >>> worth_warming(load_run_config("tiny-cpu"))
    False
    """
    import os

    return cfg.train.device != "cpu" and os.path.exists("/dev/nvidiactl")


def start_warm_imports(modules: tuple[str, ...] = MODULES) -> threading.Thread | None:
    """Import `modules` on a daemon thread (module doc); returns the started thread (None: all imported already).
    A module that fails to import is skipped. What the imports print (a library's logging or warnings) is kept,
    not shown: the stages' own imports print into the run's log, and so must these (`drain`)."""
    missing = tuple(m for m in modules if m not in sys.modules)
    if not missing:
        return None

    def work() -> None:
        for name in missing:
            try:
                importlib.import_module(name)
            except Exception:   # noqa: BLE001,S112 - the stage that needs it raises with its own message
                continue

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


THREAD_NAME = "packtrain-warm-imports"
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
