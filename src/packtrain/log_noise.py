"""Known, harmless messages of the libraries packtrain uses, dropped where they are logged — nothing else.

    message (stderr of every command that loads a model, on a CPU build)          logger, why it is harmless
    "Failed to load …/torchao/_C_mxfp8….so: Could not load this library" (×2)     torchao: its CUDA kernels, which a
                                                                                  host without CUDA cannot load
    "<enum 'KernelPreference'> is an Enum subclass and is now natively            torch.utils._pytree: torchao
     supported by torch.compile …" (×2)                                           registers its enums the old way
    "`pretrained` model kwarg is not of type `str`…", "Passed an already-          lm_eval.models.huggingface,
     initialized model through `pretrained`…", "Overwriting default num_fewshot    lm_eval.evaluator: packtrain hands
     of … to 0"                                                                   lm-eval its loaded model, 0-shot

transformers imports torchao whenever a model class loads and torchao is installed (its quantizer registry), so
these reached every standalone command. Each filter sits on the one logger that emits the message and matches
its text: anything else those loggers say still shows, and on a host with CUDA torchao's load failures show
(there they matter). The third source of noise, lm-eval's `git describe` ("fatal: not a git repository"), is a
subprocess, not a log record: packtrain.evaluate.tasks runs it quietly.

`plain_own_warnings()`: a warning packtrain's own code raises (a telemetry threshold crossed, a checkpoint
quarantined) prints as one line, `warning: <message>`, not as Python's `<file>:<line>: <Category>: <message>`
followed by the source line that raised it; other packages' warnings keep Python's format.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

_DROPPED = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
    "lm_eval.models.huggingface": ("`pretrained` model kwarg is not of type `str`",
                                   "Passed an already-initialized model through `pretrained`"),
    "lm_eval.evaluator": ("Overwriting default num_fewshot of ",),
}


class _Known(logging.Filter):
    def __init__(self, logger: str, needles: tuple[str, ...]):
        super().__init__()
        self.logger, self.needles = logger, needles

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if not any(n in msg for n in self.needles):
            return True
        if self.logger == "torchao":   # a CUDA host failing to load torchao's kernels is news: keep it there
            torch = sys.modules.get("torch")
            return bool(torch is not None and torch.cuda.is_available()) or "torchao" not in msg
        return False


def silence_known_noise() -> None:
    """Install the filters (module doc) once per process; cheap (no library is imported)."""
    for name, needles in _DROPPED.items():
        lg = logging.getLogger(name)
        if not any(isinstance(f, _Known) for f in lg.filters):
            lg.addFilter(_Known(name, needles))


_PACKAGE = Path(__file__).resolve().parent


def plain_own_warnings() -> None:
    """Install the one-line format for warnings raised in packtrain's own files (module doc)."""
    python_format = warnings.formatwarning
    if getattr(python_format, "packtrain_plain", False):
        return

    def one_line(message, category, filename, lineno, line=None):
        if Path(filename).resolve().is_relative_to(_PACKAGE):   # not a sibling such as …/packtrain_plugins
            return f"warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    one_line.packtrain_plain = True   # type: ignore[attr-defined]
    warnings.formatwarning = one_line
