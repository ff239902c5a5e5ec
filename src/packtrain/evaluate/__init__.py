"""Evaluation and registration: held-out perplexity on packed batches, champion/challenger in MLflow.

    evaluate(model_dir, eval_split_dir, cfg: EvalConfig) -> EvalResult          perplexity.py
    register_model(model_dir, eval_result, train_result_path, cfg) -> RegisterResult   register.py
    RegisterResult: what register_model did (register_result.json)              registration.py
    load_champion(name, tracking_uri) -> (model, tokenizer)                     registry.py
    build_tiny_model_dir(out_dir, texts)                                       tiny.py (tests, smoke runs)

Names resolve lazily, so `import packtrain.evaluate` costs no torch/mlflow import.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "evaluate": "perplexity", "EvalResult": "perplexity", "evaluate_batches": "perplexity",
    "batch_loss_sum": "perplexity", "register_model": "register", "RegisterResult": "registration",
    "decide_from_verdict": "champion", "load_champion": "registry", "load_registered": "registry",
    "generate_samples": "samples", "build_tiny_model_dir": "tiny", "collect_lineage": "lineage",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"packtrain.evaluate.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'packtrain.evaluate' has no attribute {name!r}")
