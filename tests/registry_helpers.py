"""Register a model directory the way the register stage does, without a pipeline: the op
(packtrain.registry.op.build_registration) applied by packtrain.registry.apply.apply_registration in the active
MLflow run, or in a new run "register", on the fluent tracking URI. For tests that register hand-made models."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path


def register_model_dir(model_dir: str | Path, eval_result, train_result_path: str | Path | None, cfg,
                       before_alias: Callable[[str], None] | None = None, verdict=None):
    """The RegisterOutcome of registering `model_dir` under `cfg` (RegisterConfig). `eval_result`: evaluate_result.json's
    dict; `verdict`: a PromotionVerdict (None: only a first version becomes champion); `before_alias(version)` runs
    between the decision and the compare-and-set."""
    import mlflow
    from mlflow import MlflowClient

    from packtrain.registry.apply import apply_registration
    from packtrain.registry.op import build_registration
    from packtrain.registry.outcome import RegisterOutcome

    op = build_registration(model_dir, eval_result, train_result_path, cfg, verdict=verdict)
    with contextlib.ExitStack() as stack:
        if mlflow.active_run() is None:
            # in the store's Default experiment (id 0 in every sqlite store) by name, not by whatever
            # MLFLOW_EXPERIMENT_ID an earlier test's mlflow.set_experiment left in this process's environment: it
            # names an experiment of another store (seen under pytest-xdist: "No Experiment with id=1 exists")
            stack.enter_context(mlflow.start_run(run_name="register", experiment_id="0"))
        run_id = mlflow.active_run().info.run_id
        out = apply_registration(MlflowClient(), mlflow.get_tracking_uri(), run_id, {**op, "ts": time.time()},
                                 Path(op["path"]), before_alias)
    return RegisterOutcome(**out)
