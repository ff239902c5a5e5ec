"""MLflow tracking for every stage: `with stage_run("pack", cfg, ...) as run: run.log_stats(...)`.

One parent run per pipeline run (`start_pipeline_run` / `end_pipeline_run`), one nested run per stage (run
name = stage name). The parent is found through the environment variable PACKTRAIN_PARENT_RUN_ID (set by
`start_pipeline_run`, inherited by `packtrain run`'s stages, the KFP components and the Airflow DAG);
without it a stage run is top-level. Tracking URI: MLFLOW_TRACKING_URI if set, else
`cfg.tracking.tracking_uri`, else sqlite:///<workdir>/mlflow.db. `cfg.tracking.enabled=false` (and every
rank but 0) turns all of it into no-ops (the stage still runs). When the store is unreachable, calls are
buffered to <workdir>/mlflow-buffer and replayed when it returns (`packtrain mlflow replay` replays leftovers),
each op exactly once (packtrain.tracking.replay). Credentials in the URI never reach the buffer, the runs or
the logs: they are recorded as `user:***@host` (packtrain.secrets).

Run references (`resolve_run_ref`: full id, ≥ 6-character prefix, NAME@ALIAS, models:/NAME/VERSION) are in
packtrain.tracking.refs; a cached stage's run copies its origin run (packtrain.tracking.restore); where to
open a run for each store kind is packtrain.tracking.links.
"""

from packtrain.tracking.buffer import replay_dir
from packtrain.tracking.context import PARENT_ENV, is_rank_zero
from packtrain.tracking.refs import RunRefError, resolve_run_ref, short_id, stage_run_of
from packtrain.tracking.replay import ReplayResult, recorded_uris
from packtrain.tracking.run_handle import StageRun
from packtrain.tracking.run_lifecycle import (
    buffer_dir_for,
    end_pipeline_run,
    resolve_tracking_uri,
    stage_run,
    start_pipeline_run,
)

__all__ = ["StageRun", "stage_run", "resolve_tracking_uri", "start_pipeline_run", "end_pipeline_run",
           "buffer_dir_for", "replay_dir", "recorded_uris", "ReplayResult", "is_rank_zero", "PARENT_ENV",
           "resolve_run_ref", "stage_run_of", "short_id", "RunRefError"]
