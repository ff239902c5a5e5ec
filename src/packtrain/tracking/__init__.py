"""MLflow tracking for every stage: `with stage_run("pack", cfg, ...) as run: run.log_stats(...)`.

One parent run per pipeline run, one nested run per stage (run name = stage name). The parent is found
through the environment variable PACKTRAIN_PARENT_RUN_ID (set by `packtrain run`, the KFP components and
the Airflow DAG); without it a stage run is top-level. Tracking URI: MLFLOW_TRACKING_URI if set, else
`cfg.tracking.tracking_uri`, else sqlite:///<workdir>/mlflow.db. `cfg.tracking.enabled=false` turns all
of it into no-ops (the stage still runs).
"""

from packtrain.tracking.run import StageRun, resolve_tracking_uri, stage_run

__all__ = ["StageRun", "stage_run", "resolve_tracking_uri"]
