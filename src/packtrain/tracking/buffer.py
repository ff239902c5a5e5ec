"""MLflow calls that survive an unreachable tracking store: a local JSONL buffer, replayed exactly once.

Every tracking call packtrain makes goes through `BufferedClient` as one *op* (a JSON-able dict) with a
stable id (uuid4 hex, drawn when the call is made) and the store's URI *with its password redacted*::

    {"op": "create_run", "id": "9c1e…", "uri": "https://user:***@host", "pending_id": "pending-3f2a…",
     "experiment": "packtrain", "run_name": "train", "tags": {...}, "start_time": 1767225600000}
    {"op": "log_batch", "id": …, "run_id": "<id or pending id>", "metrics": [[key, value, ts_ms, step]],
     "params": {...}, "tags": {...}}
    {"op": "log_artifact", …, "path": "/abs/src", "buffered_path": "artifacts/<op id>/<name>", "artifact_path": "plots"}
    {"op": "log_input", …, "name": "documents", "digest": "<dvc md5>", "source": "/abs/path", "context": "input"}
    {"op": "set_terminated", …, "run_id": …, "status": "FINISHED", "end_time": …}
    {"op": "register_model", …, "path": "/abs/model", "buffered_path": "artifacts/<op id>/model", "name": …}

Live: the op runs at once against the store. When it fails because the store is unreachable (connection
refused, timeout, HTTP 5xx/429, sqlite "database is locked"), it is appended (write + fsync) to
`<buffer_dir>/<time_ns>-<host>-<pid>.jsonl` (files it names are first copied to `artifacts/<op id>/`; a run
created while down gets a `pending-<uuid>` id) and for `retry_after_s` further ops go straight to the buffer
without touching the network (the window doubles with each consecutive failure, up to 60 s). The first op
after the window probes the store (2 s timeout), replays the backlog (this process's file, then files left
by exited processes: packtrain.tracking.replay) and then runs live. `packtrain mlflow replay` replays what is
left. A replay never rewrites a buffer file: it records each applied op id in `applied.log` (append + fsync,
packtrain.tracking.ledger) and deletes a file once all its ops are applied. Replaying twice, after a kill -9
at any op, or from a copy of the buffer directory applies every op once (packtrain.tracking.store_ops says why
the store side is idempotent too).

Secrets: ops record `redact_uri(uri)` (`https://user:***@host`), param and tag values pass through
`redact_text`, and warnings name the redacted URI (packtrain.secrets). Replay takes the credentials from
--tracking-uri or MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN).

HTTP stores are called with MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 and a 5 s timeout (artifact uploads, model
registration and replays keep MLFLOW_HTTP_REQUEST_TIMEOUT, default 120 s). A dead server costs one refused
connection (~1 ms) per retry window; a black-holed one a 5 s timeout, then one 2 s probe per window; never
MLflow's default of 7 retries with exponential backoff (minutes). A process holds an exclusive flock on its
own file while alive; a replay skips locked files, so two processes never replay the same file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from packtrain.secrets import redact_text, redact_uri, redact_value
from packtrain.tracking.ledger import AppliedLog, read_ids
from packtrain.tracking.replay import ReplayResult, replay_file, replay_files
from packtrain.tracking.store_creation import ensure_store
from packtrain.tracking.store_ops import PENDING, apply_op
from packtrain.tracking.transport import Blocked, is_transient, short_http

log = logging.getLogger(__name__)
HEAVY = ("log_artifact", "register_model")  # keep MLflow's long HTTP timeout


class BufferedClient:
    """An MlflowClient wrapper whose every op either reaches the store or lands in the buffer, in order.

    `uri` is the store as given (it may carry credentials: it is only used to connect); `shown_uri` is the
    redacted form written into ops and messages.
    """

    def __init__(self, tracking_uri: str, buffer_dir: str | Path, retry_after_s: float = 5.0):
        from mlflow import MlflowClient

        self.uri = tracking_uri
        self.shown_uri = redact_uri(tracking_uri) or ""
        self.buffer_dir = Path(buffer_dir)
        self.retry_after_s = retry_after_s
        self.applied = AppliedLog(self.buffer_dir)
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")   # its "View run at <uri>" line
        ensure_store(tracking_uri)   # a fresh sqlite store is created by one process at a time (tracking.store_creation)
        self._client = MlflowClient(tracking_uri)
        self._lock = threading.RLock()
        self._down_until = 0.0
        self._down_since: float | None = None
        self._failures = 0  # consecutive; the retry window doubles with each, up to 60 s
        self._fh: TextIO | None = None  # own buffer file, flock'ed while open
        self._own_path: Path | None = None
        self._backlog = 0  # ops in the own file not applied yet
        self._scanned_orphans = False
        self._ids: dict[str, str] = {}
        self._experiments: dict[str, str] = {}

    # -- public ops ------------------------------------------------------------------------------------
    @property
    def down(self) -> bool:
        return self._down_since is not None

    def create_run(self, experiment: str, run_name: str, tags: dict[str, str],
                   start_time: int | None = None) -> str:
        """A real run id, or `pending-<uuid>` when the store is unreachable (resolved on replay)."""
        op = {"op": "create_run", "experiment": experiment, "run_name": run_name,
              "tags": {k: redact_value(v) for k, v in tags.items()}, "start_time": start_time or _now_ms(),
              "pending_id": PENDING + uuid.uuid4().hex}
        rid = self.submit(op)
        return rid if rid is not None else str(op["pending_id"])

    def log_batch(self, run_id: str, metrics: Sequence[Sequence] = (), params: dict | None = None,
                  tags: dict | None = None) -> None:
        if metrics or params or tags:
            self.submit({"op": "log_batch", "run_id": run_id, "metrics": [list(m) for m in metrics],
                         "params": {k: redact_value(v) for k, v in (params or {}).items()},
                         "tags": {k: redact_value(v) for k, v in (tags or {}).items()}})

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.submit({"op": "log_artifact", "run_id": run_id, "path": str(Path(path).resolve()),
                     "artifact_path": artifact_path})

    def log_input(self, run_id: str, name: str, digest: str, source: str, context: str = "input") -> None:
        self.submit({"op": "log_input", "run_id": run_id, "name": name, "digest": digest,
                     "source": redact_text(source), "context": context})

    def set_terminated(self, run_id: str, status: str = "FINISHED", end_time: int | None = None) -> None:
        self.submit({"op": "set_terminated", "run_id": run_id, "status": status, "end_time": end_time or _now_ms()})

    def resolve(self, run_id: str | None) -> str | None:
        """pending id → real id once replayed (also across processes, via run_ids.json)."""
        if not run_id or not run_id.startswith(PENDING):
            return run_id
        if run_id not in self._ids:
            self._ids.update(read_ids(self.buffer_dir))
        return self._ids.get(run_id, run_id)

    def submit(self, op: dict) -> Any:
        """Run `op` live (after replaying any backlog) or buffer it. Returns the live result or None."""
        op = {**op, "id": op.get("id") or uuid.uuid4().hex, "uri": self.shown_uri, "ts": time.time()}
        with self._lock:
            if time.monotonic() < self._down_until:
                self._append(op)
                return None
            try:
                if self.down:  # a cheap probe with a 2 s timeout before sending a backlog
                    with short_http(self.uri, 2):
                        self._client.search_experiments(max_results=1)
                # artifacts (maybe large, maybe in the backlog) keep MLflow's timeout; everything else gets 5 s
                heavy = op["op"] in HEAVY or self._backlog > 0
                with short_http(self.uri, None if heavy else 5):
                    if self._backlog or not self._scanned_orphans:
                        self._replay_backlog()
                    result = self._apply(op)
            except Exception as e:
                if not is_transient(e):
                    raise
                self._mark_down(e)
                self._append(op)
                return None
            if self.down:
                log.warning("MLflow tracking store %s is reachable again after %.0f s: buffer replayed",
                            self.shown_uri, time.monotonic() - (self._down_since or 0))
                self._down_since = None
            self._failures = 0
            return result

    def close(self) -> None:
        """Release the buffer file (deleted when all its ops are applied) so `packtrain mlflow replay` may
        take it."""
        with self._lock:
            if self._fh is None:
                return
            if self._backlog == 0 and self._own_path is not None:
                self._own_path.unlink(missing_ok=True)
            self._fh.close()
            self._fh = None
            self._own_path = None

    # -- internals ---------------------------------------------------------------------------------------
    def _apply(self, op: dict) -> Any:
        return apply_op(self, op)

    def _mark_down(self, err: BaseException) -> None:
        self._failures += 1
        backoff = self.retry_after_s * 2 ** min(self._failures - 1, 16)
        self._down_until = time.monotonic() + min(backoff, max(60.0, self.retry_after_s))
        self._scanned_orphans = False  # files other processes left meanwhile are replayed on recovery
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("MLflow tracking store %s not usable (%s): buffering to %s; replayed when it "
                        "returns or by `packtrain mlflow replay`", self.shown_uri,
                        redact_text(str(err).splitlines()[0][:200] if str(err) else type(err).__name__),
                        self.buffer_dir)

    def _append(self, op: dict) -> None:
        """Write `op` to this process's buffer file (fsync'ed); a file it names is copied in first."""
        if op["op"] in HEAVY and op.get("path") and not op.get("buffered_path"):
            src = Path(op["path"])
            rel = Path("artifacts") / op["id"] / src.name
            dst = self.buffer_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            elif src.exists():
                shutil.copy2(src, dst)
            op = {**op, "buffered_path": str(rel)}
        if op["op"] == "create_run":
            op = {**op, "buffered_create": True}
        if self._fh is None:
            self.buffer_dir.mkdir(parents=True, exist_ok=True)
            name = f"{time.time_ns()}-{socket.gethostname()}-{os.getpid()}.jsonl"
            tmp = self.buffer_dir / f".{name}.new"
            self._fh = open(tmp, "a+", encoding="utf-8")  # noqa: SIM115 - held for the process lifetime
            fcntl.flock(self._fh, fcntl.LOCK_EX)
            tmp.rename(self.buffer_dir / name)  # visible to replayers only once locked
            self._own_path = self.buffer_dir / name
        start = self._fh.tell()
        try:
            self._fh.write(json.dumps(op, default=str) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError:   # a full disk: no half line is left behind, the ops before it stay replayable
            with contextlib.suppress(OSError):
                self._fh.truncate(start)
            raise
        self._backlog += 1

    def _replay_backlog(self) -> None:
        if self._backlog and self._fh is not None:
            res = replay_file(self, self._fh, self._own_path.name if self._own_path else "", self.shown_uri)
            for msg in res.refused:
                log.error("%s", msg)
            self._backlog = res.left
            if res.left:
                raise Blocked(f"{res.left} buffered ops still pending")
            self._fh.seek(0)  # every op in it is in applied.log: nothing is lost by emptying it
            self._fh.truncate()
        if not self._scanned_orphans:
            self._scanned_orphans = True
            res = replay_files(self.buffer_dir, client=self)
            for msg in res.refused:
                log.error("%s", msg)
            if res.applied:
                log.warning("replayed %d buffered MLflow ops from %d file(s) in %s", res.applied, res.files,
                            self.buffer_dir)


def replay_dir(buffer_dir: str | Path, tracking_uri: str | None = None) -> ReplayResult:
    """Replay every unlocked buffer file in `buffer_dir` (`packtrain mlflow replay`): the ops of each store
    through a BufferedClient of that store, or all to `tracking_uri` (packtrain.tracking.replay.replay_files)."""
    return replay_files(buffer_dir, tracking_uri, open_client=BufferedClient)


def _now_ms() -> int:
    return int(time.time() * 1000)
