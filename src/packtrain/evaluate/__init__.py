"""Evaluation: held-out perplexity on packed batches, the suites, both models scored, the paired comparison.

    evaluate(model_dir, eval_split_dir, cfg: EvalConfig) -> EvalResult          perplexity.py

Registration, the champion/challenger aliases and loading a registered model live in packtrain.registry.

Names resolve lazily, so `import packtrain.evaluate` costs no torch/mlflow import.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "evaluate": "perplexity", "EvalResult": "perplexity", "evaluate_batches": "perplexity",
    "batch_loss_sum": "perplexity", "generate_samples": "samples",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"packtrain.evaluate.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'packtrain.evaluate' has no attribute {name!r}")
