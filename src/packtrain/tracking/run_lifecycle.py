"""Pipeline and stage runs: `with stage_run("pack", cfg, section=cfg.pack) as run: run.log_stats(...)`.

    start_pipeline_run(cfg) -> run_id          parent run "<recipe>", renamed "<recipe> · data <8 hex>" once
                                               ingest knows the data version (name_pipeline_run); exports
                                               PACKTRAIN_PARENT_RUN_ID
      stage_run("ingest", cfg, ...)            nested run "ingest" (tag mlflow.parentRunId)
      stage_run("train", cfg, ...)             ... one per stage, in this or a child process
        run.log_finals({...})                  final numbers: the pipeline run's `<stage>.<key>` + summary.json
    name_pipeline_run(cfg, data_version)       the name, once ingest knows the data version
    end_pipeline_run(run_id, "FINISHED")

Which run holds what (docs/tracking.md, "The MLflow layout"): per-step series on the stage run at their real
step, system series under `system/` at their sample time, final numbers once — on the pipeline run.

Every call goes through `BufferedClient` (packtrain.tracking.buffer): when the store is unreachable ops are
buffered to <workdir>/mlflow-buffer (cfg.tracking.buffer_dir) and replayed, each exactly once, when it
returns. Param and tag values (e.g. the pipeline run's `tracking.tracking_uri`) are logged with credentials
redacted (`user:***@host`, packtrain.secrets). `StageRun.submit(op)` sends a custom op such as the model
registration (buffered too: packtrain.registry.op). Only rank 0
logs (RANK / LOCAL_RANK); other ranks and `tracking.enabled: false` get a `StageRun` whose methods do nothing.
This module opens and closes the runs and keeps one client per store; `StageRun`, the handle a stage logs
through, is packtrain.tracking.run_handle.
MLflow's own system metrics (cpu/memory/disk/network/GPU under system/...) run on a separate monitor.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from packtrain.config import RunConfig, flatten
from packtrain.tracking.buffer import BufferedClient
from packtrain.tracking.context import PARENT_ENV, base_tags, is_rank_zero
from packtrain.tracking.run_handle import StageRun
from packtrain.tracking.store_ops import PENDING
from packtrain.tracking.system_metrics import start_system_metrics, stop_system_metrics
from packtrain.tracking.transport import short_http

log = logging.getLogger(__name__)
STATUSES = ("FINISHED", "FAILED", "KILLED")
_clients: dict[tuple[str, str], BufferedClient] = {}
_clients_lock = threading.Lock()
_pipeline_clients: dict[str, BufferedClient] = {}
_stage_runs: dict[str, tuple[BufferedClient, str]] = {}   # stage → (client, run id) of its newest run here


def open_fluent_store(uri: str) -> None:
    """Point the fluent API at a run's store (`set_fluent_tracking_uri`), a fresh sqlite store created first under
    the store lock (`ensure_store`), as the stage clients do, not migrated by MLflow without a lock. Not for
    putting back an earlier URI: MLflow's default is a `mlflow.db` in the working directory."""
    from packtrain.tracking.store_creation import ensure_store

    ensure_store(uri)
    set_fluent_tracking_uri(uri)


def set_fluent_tracking_uri(uri: str) -> None:
    """mlflow.set_tracking_uri for the fluent API without its side effect on os.environ: MLflow 3 also writes
    MLFLOW_TRACKING_URI, which `resolve_tracking_uri` honours first — so the first stage's store would stick
    for every later stage in the process, whatever their workdir."""
    import mlflow
    from mlflow.tracking import fluent

    before = os.environ.get("MLFLOW_TRACKING_URI")
    if mlflow.get_tracking_uri() != uri and fluent._active_experiment_id is not None:
        # an experiment id set in this process (mlflow.set_experiment, which also exports MLFLOW_EXPERIMENT_ID)
        # belongs to the previous store: on the new one it names nothing or another experiment
        if os.environ.get("MLFLOW_EXPERIMENT_ID") == fluent._active_experiment_id:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        fluent._active_experiment_id = None
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def resolve_tracking_uri(cfg: RunConfig) -> str:
    """MLFLOW_TRACKING_URI, else cfg.tracking.tracking_uri, else sqlite:///<workdir>/mlflow.db."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    db = (Path(cfg.workdir) / "mlflow.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def buffer_dir_for(cfg: RunConfig) -> Path:
    """cfg.tracking.buffer_dir, else <workdir>/mlflow-buffer."""
    return Path(cfg.tracking.buffer_dir or Path(cfg.workdir) / "mlflow-buffer").resolve()


def get_client(cfg: RunConfig) -> BufferedClient:
    """One BufferedClient per (store, buffer dir) per process, closed at exit."""
    key = (resolve_tracking_uri(cfg), str(buffer_dir_for(cfg)))
    with _clients_lock:
        if key not in _clients:
            _clients[key] = BufferedClient(key[0], key[1], retry_after_s=cfg.tracking.retry_after_s)
        return _clients[key]


@atexit.register
def _close_clients() -> None:
    for c in list(_clients.values()):
        with contextlib.suppress(Exception):
            c.close()


# -- runs ------------------------------------------------------------------------------------------------
def start_pipeline_run(cfg: RunConfig) -> str | None:
    """Open the parent run of a pipeline run and export PACKTRAIN_PARENT_RUN_ID for its stages.

    Named after the recipe (`tiny-cpu`) until the data version is known (`name_pipeline_run`). Params: the
    whole run config, flattened (`pack.budget`, `train.lr`, ...). Returns the run id (`pending-...` while the
    store is unreachable), or None when tracking is off or rank ≠ 0. The run records this process as its owner
    (packtrain.tracking.owner: this process ends it), and opening it marks KILLED the runs — pipeline runs
    included — that a killed process left RUNNING in the experiment.
    """
    from packtrain.tracking.layout import pipeline_run_name
    from packtrain.tracking.owner import end_orphaned_runs, owner_tags

    if not cfg.tracking.enabled or not is_rank_zero():
        return None
    client = get_client(cfg)
    run_id = client.create_run(cfg.tracking.experiment, pipeline_run_name(cfg.name, None),
                               {**base_tags("pipeline", cfg.name), **owner_tags()})
    end_orphaned_runs(client, cfg.tracking.experiment, "pipeline run")   # e.g. a kill -9'd `packtrain run`
    handle = StageRun(client, run_id, "pipeline")
    handle.log_params(flatten(cfg.to_dict()))
    os.environ[PARENT_ENV] = run_id
    _pipeline_clients[run_id] = client
    return run_id


def name_pipeline_run(cfg: RunConfig, data_version: str | None, run_id: str | None = None) -> None:
    """Rename the pipeline run (`run_id`, default PACKTRAIN_PARENT_RUN_ID) to `<recipe> · data <8 hex>`
    (packtrain.tracking.layout.pipeline_run_name) once the ingest stage knows the data version. Nothing without
    a pipeline run, a data version, tracking, or off rank 0; the same name again is harmless. Buffered."""
    from packtrain.tracking.layout import pipeline_run_name

    run_id = run_id or os.environ.get(PARENT_ENV)
    if not run_id or not data_version or not cfg.tracking.enabled or not is_rank_zero():
        return
    get_client(cfg).log_batch(run_id, tags={"mlflow.runName": pipeline_run_name(cfg.name, data_version)})


def end_pipeline_run(run_id: str | None, status: str = "FINISHED", cfg: RunConfig | None = None) -> None:
    """Close the parent run (FINISHED | FAILED | KILLED) and stop exporting it to stages.

    In the process that started it `cfg` is optional; elsewhere pass the run's `cfg` (store + buffer dir).
    """
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    if not run_id or not is_rank_zero():
        return
    client = get_client(cfg) if cfg is not None else _pipeline_clients.get(run_id)
    if client is None:
        raise ValueError(f"end_pipeline_run({run_id!r}): not started in this process; pass cfg=")
    client.set_terminated(run_id, status)
    _pipeline_clients.pop(run_id, None)
    if os.environ.get(PARENT_ENV) == run_id:
        del os.environ[PARENT_ENV]


def stage_run_record(stage: str) -> dict | None:
    """{"run_id", "tracking_uri" (redacted)} of the newest `stage_run(stage, ...)` opened in this process, or
    None (tracking off, rank ≠ 0, or the run happened in another process). A `pending-...` id while the run
    waits in the buffer. The stage cache keeps it as the origin a cache hit copies (packtrain.tracking.restore).
    """
    if stage not in _stage_runs:
        return None
    client, run_id = _stage_runs[stage]
    return {"run_id": client.resolve(run_id), "tracking_uri": client.shown_uri}


def with_stage_run_record(stage: str, stats: Any) -> Any:
    """`stats` (a dict) + {"mlflow_run": stage_run_record(stage)} when the stage opened a run here.

    >>> # with_stage_run_record("pack", {"fill": 0.99})
    >>> # → {"fill": 0.99, "mlflow_run": {"run_id": "3f2a…", "tracking_uri": "sqlite:////abs/data/mlflow.db"}}
    """
    rec = stage_run_record(stage)
    if rec is None or not isinstance(stats, dict):
        return stats
    return {**stats, "mlflow_run": rec}


@contextlib.contextmanager
def stage_run(stage: str, cfg: RunConfig, section: Any = None, tags: Mapping[str, Any] | None = None
              ) -> Iterator[StageRun]:
    """Open the MLflow run of one stage (nested under PACKTRAIN_PARENT_RUN_ID when set).

    Params: the stage's own config section, flattened (`pack.budget`, ...). Tags: `base_tags` (stage,
    recipe, git sha, host, GPU, KFP/Airflow run ids) + `tags`. The run is also the active fluent run, so
    `mlflow.<flavor>.log_model` inside the block attaches to it. A failing stage ends its run FAILED
    (KILLED on Ctrl-C) and re-raises. The run records its process as owner tags, and opening it marks KILLED
    the runs of the experiment a killed process left RUNNING (packtrain.tracking.owner).
    """
    if not cfg.tracking.enabled or not is_rank_zero():
        yield StageRun(None, None, stage)
        return
    import mlflow

    from packtrain.tracking.owner import end_orphaned_runs, owner_tags

    client = get_client(cfg)
    run_tags = {**base_tags("stage", cfg.name, stage), **owner_tags()}
    parent = os.environ.get(PARENT_ENV)
    if parent:
        run_tags["mlflow.parentRunId"] = client.resolve(parent) or parent
    run_id = client.create_run(cfg.tracking.experiment, stage, run_tags)
    end_orphaned_runs(client, cfg.tracking.experiment, f"stage {stage}")   # runs a killed process left RUNNING → KILLED
    _stage_runs[stage] = (client, run_id)
    handle = StageRun(client, run_id, stage, cfg.tracking.flush_interval_s, parent=parent or None)
    fluent = monitor = None
    if not run_id.startswith(PENDING):
        set_fluent_tracking_uri(client.uri)
        with short_http(client.uri, 5), contextlib.suppress(Exception):
            fluent = mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None,
                                      log_system_metrics=False)
        if cfg.tracking.system_metrics:
            monitor = start_system_metrics(run_id, client.uri, cfg.tracking.system_metrics_interval_s)
    status = "FINISHED"
    try:
        if section is not None:
            data = section.model_dump(mode="json") if hasattr(section, "model_dump") else dict(section)
            handle.log_params({f"{stage}.{k}": v for k, v in flatten(data).items()})
        handle.set_tags(dict(tags or {}))
        yield handle
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        try:
            _end_stage_run(handle, client, run_id, status, monitor)
        finally:  # never leave the fluent run active, whatever the store said
            active = mlflow.active_run()
            if fluent is not None and active is not None and active.info.run_id == run_id:
                with short_http(client.uri, 2), contextlib.suppress(Exception):
                    mlflow.end_run(status)


def _end_stage_run(handle: StageRun, client: BufferedClient, run_id: str, status: str, monitor: Any) -> None:
    """Flush the stage's metrics and end its run with `status`. A run ending FAILED/KILLED ends while the stage's
    own error propagates: a store that cannot take the end now (the disk that filled up holds it too) costs a
    warning, never that error (before, a full disk surfaced as the buffer's `OSError: [Errno 28]` and the run
    stayed RUNNING). Each step is tried whatever the one before did."""
    steps = (handle.flush, lambda: stop_system_metrics(monitor), lambda: client.set_terminated(run_id, status))
    for step in steps:
        if status == "FINISHED":
            step()
            continue
        try:
            step()
        except Exception as e:   # noqa: BLE001 - the stage's own error is the one to report
            log.warning("could not mark MLflow run %s %s: %s", run_id, status,
                        str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
