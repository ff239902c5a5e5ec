"""`save_pretrained` without the deepspeed import it costs when deepspeed is installed but not in use.

transformers' `PreTrainedModel.save_pretrained` first unwraps the model through accelerate's
`extract_model_from_parallel`, which, whenever deepspeed is *installed*, imports it to test the model against
`DeepSpeedEngine`: ~0.5 s in a process that has imported mlflow, ~1.5 s in one that has not (deepspeed imports
mlflow), paid by every train stage that saves its model and by every register that logs one. A model can only be
a DeepSpeedEngine once deepspeed has been imported, so while it is not in `sys.modules` the test is skipped (the
answer is "no" either way); with deepspeed imported (train.engine=deepspeed) nothing changes.

    with no_deepspeed_probe():
        model.save_pretrained(out, safe_serialization=True)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_lock = threading.RLock()


@contextlib.contextmanager
def no_deepspeed_probe() -> Iterator[None]:
    """Within the block, accelerate's unwrap does not import deepspeed unless it is imported already."""
    if "deepspeed" in sys.modules:
        yield
        return
    try:
        import accelerate.utils.other as other
    except ImportError:   # no accelerate: transformers unwraps by itself, without deepspeed
        yield
        return
    if not callable(getattr(other, "is_deepspeed_available", None)):   # another accelerate: leave it be
        yield
        return
    with _lock:
        probe = other.is_deepspeed_available
        other.is_deepspeed_available = lambda: "deepspeed" in sys.modules
        try:
            yield
        finally:
            other.is_deepspeed_available = probe


def save_pretrained(model: Any, path: str | Path, **kwargs: Any) -> None:
    """`model.save_pretrained(path, **kwargs)` under `no_deepspeed_probe` (module doc)."""
    with no_deepspeed_probe():
        model.save_pretrained(path, **kwargs)
