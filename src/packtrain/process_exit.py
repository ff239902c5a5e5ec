"""The end of a packtrain process: `freeze_heap_at_exit()` registers `gc.freeze` as an atexit handler, so the
interpreter's teardown only frees what is alive then instead of garbage-collecting every object torch,
transformers and MLflow made (~1.5 CPU-s a process: `dvc repro` starts one `packtrain <stage>` per stage, a KFP
pipeline one component process per step). atexit handlers registered later still run first (MLflow runs ended,
logs flushed). Registered once however often it is called (a test calling `packtrain.cli.main` in its own process
freezes only when that process ends)."""

from __future__ import annotations

import atexit
import gc


def freeze_heap_at_exit() -> None:
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
