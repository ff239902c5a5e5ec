"""The stage-run context manager. mlflow is imported lazily, only when tracking is enabled."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from packtrain.config import RunConfig, flatten

PARENT_ENV = "PACKTRAIN_PARENT_RUN_ID"


def resolve_tracking_uri(cfg: RunConfig) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri
    db = (Path(cfg.workdir) / "mlflow.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


class StageRun:
    """Handle to one stage's MLflow run. Every method is a no-op when tracking is disabled."""

    def __init__(self, mlflow_mod, run_id: str | None):
        self._mlflow = mlflow_mod
        self.run_id = run_id

    @property
    def enabled(self) -> bool:
        return self._mlflow is not None

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.enabled and params:
            clean = {k: ("" if v is None else str(v))[:6000] for k, v in params.items()}
            self._mlflow.log_params(clean)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        num = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if num:
            self._mlflow.log_metrics(num, step=step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled and tags:
            self._mlflow.set_tags({k: str(v) for k, v in tags.items() if v is not None})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.enabled and Path(path).exists():
            if Path(path).is_dir():
                self._mlflow.log_artifacts(str(path), artifact_path=artifact_path)
            else:
                self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def log_stats(self, stats: Mapping[str, Any], prefix: str = "", artifacts: list[Path] = ()) -> None:
        """Numeric leaves of a stats dict become metrics (dotted names); files become artifacts."""
        flat = flatten(dict(stats)) if stats else {}
        self.log_metrics({f"{prefix}{k}": v for k, v in flat.items()})
        for a in artifacts:
            self.log_artifact(a)

    def log_dataset(self, path: str | Path, name: str, digest: str | None, context: str = "input") -> None:
        """Record a dataset read by this stage via mlflow.log_input, with the DVC md5 as digest."""
        if not self.enabled:
            return
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.filesystem_dataset_source import FileSystemDatasetSource

        src = FileSystemDatasetSource(uri=str(Path(path).resolve()))
        ds = MetaDataset(source=src, name=name, digest=(digest or "unknown")[:36])
        self._mlflow.log_input(ds, context=context)


@contextlib.contextmanager
def stage_run(stage: str, cfg: RunConfig, section: Any = None, tags: Mapping[str, Any] | None = None
              ) -> Iterator[StageRun]:
    """Open the MLflow run of one stage (nested under PACKTRAIN_PARENT_RUN_ID when set).

    Params: the stage's own config section, flattened. Tags: stage, recipe, git sha, host, KFP/Airflow
    run ids when present. A failing stage ends its run with status FAILED and re-raises.
    """
    if not cfg.tracking.enabled:
        yield StageRun(None, None)
        return
    import mlflow

    mlflow.set_tracking_uri(resolve_tracking_uri(cfg))
    mlflow.set_experiment(cfg.tracking.experiment)
    parent = os.environ.get(PARENT_ENV)
    base_tags = {
        "packtrain.stage": stage,
        "packtrain.recipe": cfg.name,
        "mlflow.source.git.commit": git_sha(),
        "host": socket.gethostname(),
        "kfp.run_id": os.environ.get("KFP_RUN_ID"),
        "airflow.run_id": os.environ.get("AIRFLOW_CTX_DAG_RUN_ID"),
    }
    if parent:
        base_tags["mlflow.parentRunId"] = parent
    run = mlflow.start_run(run_name=stage, tags={k: str(v) for k, v in base_tags.items() if v})
    handle = StageRun(mlflow, run.info.run_id)
    try:
        if section is not None:
            data = section.model_dump(mode="json") if hasattr(section, "model_dump") else dict(section)
            handle.log_params({f"{stage}.{k}": v for k, v in flatten(data).items()})
        handle.set_tags(dict(tags or {}))
        yield handle
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    else:
        mlflow.end_run(status="FINISHED")
