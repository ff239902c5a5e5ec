"""A stage restored from the stage cache gets a complete MLflow run: a copy of the run that produced it.

    origin = stats["mlflow_run"]        # {"run_id", "tracking_uri"} recorded when the stage really ran
    copy = restore_run(client, new_run_id, origin)
    # → {"copied": True, "origin": "3f2a…", "metrics": 23, "points": 61, "params": 41, "tags": 18,
    #    "artifacts": 7, "datasets": 1, "param_keys": ["train.lr", ...]}

The new run (created by packtrain.pipeline.local under this pipeline run) receives, from the origin run:
every metric with its whole history (same steps, values and timestamps: the loss curve is there), every
param, the user tags (not MLflow's own `mlflow.*` bookkeeping, nor the tags the new run sets itself:
packtrain.kind/stage/recipe, host, KFP/Airflow ids, …), the input datasets, and the artifacts (up to
`max_artifact_mb`, default 256 MiB in all; above that the tag `packtrain.restored_artifacts` points at the
origin's instead). Tags `packtrain.restored_from=<origin run id>` (and `packtrain.restored_from_uri` when the
origin lives in another store, e.g. after switching from the embedded sqlite store to a server) say where it
came from.

The origin may live in another store than the new run: it is read with its own client (the redacted URI's
credentials come from MLFLOW_TRACKING_USERNAME/PASSWORD, as for replays). An origin that cannot be read
(deleted store, server down, a pending id never replayed, a sqlite file that is not an MLflow store — the
record is read from the cache entry, and MLflow would create its tables in any sqlite file it is pointed at)
never fails the pipeline: the result says why
(`{"copied": False, "reason": ...}`) and packtrain.pipeline.local logs the cached stats instead.
Writes go through the BufferedClient, so a copy made while the destination store is down is replayed later.
Cost (tiny pipeline, sqlite): 0.1–0.3 s a stage, 1.2 s for all seven; a server adds one HTTP call per metric
key and per artifact file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
RESTORED_TAG = "packtrain.restored_from"
RESTORED_URI_TAG = "packtrain.restored_from_uri"
# tags the restored run sets itself (where and when *it* ran) or MLflow bookkeeping of the origin
_OWN_TAGS = ("packtrain.kind", "packtrain.stage", "packtrain.recipe", "packtrain.version", "packtrain.gpu",
             "packtrain.world_size", "packtrain.pending_id", "packtrain.cache", "packtrain.cache_key", "host",
             "kfp.run_id", "kfp.pod_name", "airflow.run_id", "airflow.dag_id", "airflow.task_id")
_KEEP_MLFLOW_TAGS = ("mlflow.note.content",)


def origin_client(origin: dict, current: Any):
    """An MlflowClient for the origin's store: `current` (an MlflowClient) when it is the same store."""
    from mlflow import MlflowClient

    from packtrain.secrets import redact_uri

    uri = origin.get("tracking_uri") or ""
    cur_uri = getattr(getattr(current, "_tracking_client", None), "tracking_uri", "")
    if not uri or uri == redact_uri(cur_uri):
        return current
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.is_file():
            raise FileNotFoundError(f"origin store {uri} no longer exists")
        if not _is_mlflow_db(db):   # MLflow would create its tables in whatever sqlite file the record names
            raise ValueError(f"origin store {uri} (read from the cached stage's record) is not an MLflow "
                             "database: not opened, nothing written to it")
    # a recorded URI never holds a password (`user:***@host`): connect without the userinfo, MLflow then
    # takes MLFLOW_TRACKING_USERNAME/PASSWORD (or TOKEN) from the environment
    if "***" in uri:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(uri)
        uri = urlunsplit(parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")))
    return MlflowClient(uri)


def _is_mlflow_db(db: Path) -> bool:
    """Whether the sqlite file `db` already holds an MLflow store (its runs and alembic_version tables);
    opened read-only, so checking never changes it."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"runs", "alembic_version"} <= names


def restore_run(client: Any, run_id: str, origin: dict | None, *, max_artifact_mb: float = 256.0) -> dict:
    """Copy the origin run into run `run_id` of BufferedClient `client` (see the module docstring).

    Returns {"copied": True, "origin", "metrics", "points", "params", "tags", "artifacts", "datasets"} or
    {"copied": False, "origin", "reason"}; never raises for an unreadable origin.
    """
    from packtrain.secrets import redact_text

    origin = dict(origin or {})
    oid = origin.get("run_id") or ""
    if not oid or oid.startswith("pending-"):
        return {"copied": False, "origin": oid, "reason": "the origin run id is unknown" if not oid else
                f"origin {oid} was buffered and never replayed"}
    src_uri = origin.get("tracking_uri") or client.shown_uri
    tags = {RESTORED_TAG: oid}
    if src_uri != client.shown_uri:
        tags[RESTORED_URI_TAG] = src_uri
    client.log_batch(run_id, tags=tags)
    tmp = Path(tempfile.mkdtemp(prefix="packtrain-restore-"))
    try:
        try:
            got = _read_origin(origin_client(origin, client._client), src_uri, oid, tmp, max_artifact_mb)
        except Exception as e:  # the origin is a bonus: the stage's output is restored whatever MLflow says
            reason = redact_text(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            log.warning("cached stage run %s: could not read origin run %s (%s)", run_id, oid, reason)
            client.log_batch(run_id, tags={"packtrain.restored_copy": f"failed: {reason}"})
            return {"copied": False, "origin": oid, "reason": reason}
        return {"copied": True, "origin": oid, **_write_copy(client, run_id, got)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read_origin(src, src_uri: str, oid: str, tmp: Path, max_artifact_mb: float) -> dict:
    """Everything the copy needs, read from the origin store (HTTP: no retries, 10 s per call)."""
    from packtrain.tracking.transport import short_http

    with short_http(src_uri, 10):
        run = src.get_run(oid)
        rows = [[m.key, float(m.value), int(m.timestamp), int(m.step)]
                for key in run.data.metrics for m in src.get_metric_history(oid, key)]
        files = _artifact_files(src, oid, "")
    datasets = []
    for di in (run.inputs.dataset_inputs if run.inputs else []):
        source = di.dataset.source
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            source = json.loads(source).get("uri", source)
        context = next((t.value for t in di.tags if t.key == "mlflow.data.context"), "input")
        datasets.append((di.dataset.name, di.dataset.digest, str(source), context))
    total = sum(f.file_size or 0 for f in files)
    local, note = None, None
    if files and total > max_artifact_mb * 2**20:
        note = f"runs:/{oid}/ ({total / 2**20:.0f} MiB, not copied: limit {max_artifact_mb:.0f} MiB)"
    elif files:
        from packtrain.paths import patched_env

        # a large file may take longer than 10 s; no "Downloading artifacts" bars in `packtrain run`'s output
        with short_http(src_uri, None), patched_env(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false"):
            local = Path(src.download_artifacts(oid, "", str(tmp)))
    tags = {k: v for k, v in run.data.tags.items()
            if k not in _OWN_TAGS and (not k.startswith("mlflow.") or k in _KEEP_MLFLOW_TAGS)}
    if note:
        tags["packtrain.restored_artifacts"] = note
    return {"params": dict(run.data.params), "tags": tags, "rows": rows, "n_metrics": len(run.data.metrics),
            "datasets": datasets, "artifacts": local, "n_files": len(files) if local else 0}


def _write_copy(dst, run_id: str, got: dict) -> dict:
    dst.log_batch(run_id, metrics=got["rows"], params=got["params"], tags=got["tags"])
    for name, digest, source, context in got["datasets"]:
        dst.log_input(run_id, name, digest, source, context)
    if got["artifacts"] is not None:
        for entry in sorted(got["artifacts"].iterdir()):
            # a directory keeps its name as the artifact path: plots/x.png stays plots/x.png
            dst.log_artifact(run_id, entry, entry.name if entry.is_dir() else None)
    return {"metrics": got["n_metrics"], "points": len(got["rows"]), "params": len(got["params"]),
            "tags": len(got["tags"]), "artifacts": got["n_files"], "datasets": len(got["datasets"]),
            "param_keys": sorted(got["params"])}


def _artifact_files(src, oid: str, path: str) -> list:
    out = []
    for f in src.list_artifacts(oid, path or None):
        out += _artifact_files(src, oid, f.path) if f.is_dir else [f]
    return out
