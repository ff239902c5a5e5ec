"""Shared fixtures. Real parts only: MLflow on sqlite in tmp, real DVC repos, real GX, real transformers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

# Property tests: random exploration on developer machines; in CI (.ci/run sets HYPOTHESIS_PROFILE=ci) the same
# examples every run, so a counterexample found by chance fails a developer's run, not an unrelated merge.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, print_blob=True)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a dev extra
    pass


@pytest.fixture(autouse=True)
def _isolated_mlflow(monkeypatch, tmp_path):
    """No test writes to a shared MLflow store or inherits a parent run by accident."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PACKTRAIN_PARENT_RUN_ID", raising=False)
    yield
    try:
        import sys

        if "mlflow" in sys.modules:
            import mlflow

            while mlflow.active_run() is not None:
                mlflow.end_run()
    except Exception:
        pass


# Under pytest-xdist (`make test` runs `-n 2 --dist loadfile`) the slowest files start first, so the two workers
# finish together instead of one waiting out a 4-minute DVC chain at the end. Longest first (seconds on 2 workers,
# 2026-12-01: warm_start ~125, dvc ~110, local_pipeline ~105, run_server ~50, airflow ~45), except that
# local_pipeline leads: it runs the session's `tiny_pipeline`, which run_server and airflow wait for (file lock);
# queued behind local_pipeline / warm_start + dvc, they find it done.
_SLOW_FIRST = ("test_local_pipeline.py", "test_warm_start_run.py", "test_dvc.py", "test_run_server.py",
               "test_airflow_dag.py", "test_train_stage.py", "test_train_deepspeed.py", "test_secrets_full_run.py",
               "test_wheel_ir.py", "test_compare_mlflow.py", "test_train_faults.py", "test_tracking_server.py",
               "test_replay_idempotent.py", "test_publish_stages.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: file order kept otherwise
