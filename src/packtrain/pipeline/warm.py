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
import threading

MODULES = ("torch", "transformers", "packtrain.model.build", "packtrain.train.session",
           "packtrain.evaluate.loading")
"""What the train and evaluate stages import first, heaviest first."""


def start_warm_imports(modules: tuple[str, ...] = MODULES) -> threading.Thread:
    """Import `modules` on a daemon thread (module doc); returns the started thread."""

    def work() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:   # noqa: BLE001 - the stage that needs it raises with its own message
                return

    t = threading.Thread(target=work, name="packtrain-warm-imports", daemon=True)
    t.start()
    return t
