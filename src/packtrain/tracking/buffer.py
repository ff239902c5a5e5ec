"""MLflow calls that survive an unreachable tracking store: a local JSONL buffer, replayed in order.

Every tracking call packtrain makes goes through `BufferedClient` as one *op* (a JSON-able dict)::

    {"op": "create_run", "uri": ..., "pending_id": "pending-3f2a...", "experiment": "packtrain",
     "run_name": "train", "tags": {...}, "start_time": 1767225600000}
    {"op": "log_batch", "uri": ..., "run_id": "<id or pending id>", "metrics": [[key, value, ts_ms, step]],
     "params": {...}, "tags": {...}}
    {"op": "log_artifact", ..., "path": "<copy inside the buffer>", "artifact_path": "plots"}
    {"op": "log_input", ..., "name": "documents", "digest": "<dvc md5>", "source": "/abs/path", "context": "input"}
    {"op": "set_terminated", ..., "run_id": ..., "status": "FINISHED", "end_time": ...}

Live: the op runs at once against the store. When it fails because the store is unreachable (connection
refused, timeout, HTTP 5xx/429, sqlite "database is locked"), it is appended to
`<buffer_dir>/<time_ns>-<host>-<pid>.jsonl` (artifacts are copied next to it; a run created while down gets a
`pending-<uuid>` id) and for `retry_after_s` further ops go straight to the buffer without touching the
network (the window doubles with each consecutive failure, up to 60 s). The first op after the window probes
the store (2 s timeout), replays the backlog (this process's file, then files left by exited processes) and
then runs live. `packtrain mlflow replay` replays what is left. Nothing is lost: metrics keep their original
timestamps and steps, and a metric replayed twice is de-duplicated by the store.

HTTP stores are called with MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 and a 5 s timeout (artifact uploads and
replays keep MLFLOW_HTTP_REQUEST_TIMEOUT, default 120 s). A dead server costs one refused connection (~1 ms)
per retry window; a black-holed one a 5 s timeout, then one 2 s probe per window; never MLflow's default of
7 retries with exponential backoff (minutes). A process holds an exclusive flock on its own file while
alive; a replay skips locked files, so two processes never replay the same op.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.tracking.transport import Blocked, is_transient, short_http

log = logging.getLogger(__name__)
PENDING = "pending-"


@dataclass
class ReplayResult:
    applied: int = 0
    left: int = 0
    rejected: int = 0
    files: int = 0
    skipped_locked: list[str] = field(default_factory=list)

    def add(self, other: ReplayResult) -> None:
        self.applied += other.applied
        self.left += other.left
        self.rejected += other.rejected
        self.files += other.files
        self.skipped_locked += other.skipped_locked


class BufferedClient:
    """An MlflowClient wrapper whose every op either reaches the store or lands in the buffer, in order."""

    def __init__(self, tracking_uri: str, buffer_dir: str | Path, retry_after_s: float = 5.0):
        from mlflow import MlflowClient

        self.uri = tracking_uri
        self.buffer_dir = Path(buffer_dir)
        self.retry_after_s = retry_after_s
        self._client = MlflowClient(tracking_uri)
        self._lock = threading.RLock()
        self._down_until = 0.0
        self._down_since: float | None = None
        self._failures = 0  # consecutive; the retry window doubles with each, up to 60 s
        self._fh = None  # own buffer file, flock'ed while open
        self._own_path: Path | None = None
        self._backlog = 0  # ops in the own file
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
        op = {"op": "create_run", "experiment": experiment, "run_name": run_name, "tags": tags,
              "start_time": start_time or _now_ms(), "pending_id": PENDING + uuid.uuid4().hex}
        rid = self.submit(op)
        return rid if rid is not None else op["pending_id"]

    def log_batch(self, run_id: str, metrics: list[list] = (), params: dict | None = None,
                  tags: dict | None = None) -> None:
        if metrics or params or tags:
            self.submit({"op": "log_batch", "run_id": run_id, "metrics": [list(m) for m in metrics],
                         "params": dict(params or {}), "tags": dict(tags or {})})

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.submit({"op": "log_artifact", "run_id": run_id, "path": str(Path(path).resolve()),
                     "artifact_path": artifact_path})

    def log_input(self, run_id: str, name: str, digest: str, source: str, context: str = "input") -> None:
        self.submit({"op": "log_input", "run_id": run_id, "name": name, "digest": digest, "source": source,
                     "context": context})

    def set_terminated(self, run_id: str, status: str = "FINISHED", end_time: int | None = None) -> None:
        self.submit({"op": "set_terminated", "run_id": run_id, "status": status, "end_time": end_time or _now_ms()})

    def resolve(self, run_id: str | None) -> str | None:
        """pending id → real id once replayed (also across processes, via run_ids.json)."""
        if not run_id or not run_id.startswith(PENDING):
            return run_id
        if run_id not in self._ids:
            self._ids.update(_read_ids(self.buffer_dir))
        return self._ids.get(run_id, run_id)

    def submit(self, op: dict) -> Any:
        """Run `op` live (after replaying any backlog) or buffer it. Returns the live result or None."""
        op = {**op, "uri": self.uri, "ts": time.time()}
        with self._lock:
            if time.monotonic() < self._down_until:
                self._append(op)
                return None
            try:
                if self.down:  # a cheap probe with a 2 s timeout before sending a backlog
                    with short_http(self.uri, 2):
                        self._client.search_experiments(max_results=1)
                # artifacts (maybe large, maybe in the backlog) keep MLflow's timeout; everything else gets 5 s
                heavy = op["op"] == "log_artifact" or self._backlog > 0
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
                            self.uri, time.monotonic() - (self._down_since or 0))
                self._down_since = None
            self._failures = 0
            return result

    def close(self) -> None:
        """Release the buffer file (deleted when empty) so `packtrain mlflow replay` may take it."""
        with self._lock:
            if self._fh is None:
                return
            if self._backlog == 0 and self._own_path is not None:
                self._own_path.unlink(missing_ok=True)
            self._fh.close()
            self._fh = None
            self._own_path = None

    # -- internals ---------------------------------------------------------------------------------------
    def _mark_down(self, err: BaseException) -> None:
        self._failures += 1
        backoff = self.retry_after_s * 2 ** min(self._failures - 1, 16)
        self._down_until = time.monotonic() + min(backoff, max(60.0, self.retry_after_s))
        self._scanned_orphans = False  # files other processes left meanwhile are replayed on recovery
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("MLflow tracking store %s not usable (%s): buffering to %s; replayed when it "
                        "returns or by `packtrain mlflow replay`", self.uri, str(err).splitlines()[0][:200],
                        self.buffer_dir)

    def _append(self, op: dict) -> None:
        if op["op"] == "log_artifact" and not op.get("buffered"):
            src = Path(op["path"])
            dst = self.buffer_dir / "artifacts" / uuid.uuid4().hex / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            elif src.exists():
                shutil.copy2(src, dst)
            op = {**op, "path": str(dst), "buffered": True}
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
        self._fh.write(json.dumps(op, default=str) + "\n")
        self._fh.flush()
        self._backlog += 1

    def _replay_backlog(self) -> None:
        if self._backlog and self._fh is not None:
            res = self._replay_fh(self._fh)
            self._backlog = res.left
            if res.left:
                raise Blocked(f"{res.left} buffered ops still pending")
        if not self._scanned_orphans:
            self._scanned_orphans = True
            res = replay_dir(self.buffer_dir, client=self)
            if res.applied:
                log.warning("replayed %d buffered MLflow ops from %d file(s) in %s", res.applied, res.files,
                            self.buffer_dir)

    def _replay_fh(self, fh, only_uri: str | None = None) -> ReplayResult:
        """Apply the ops of a locked file in order; keep the rest from the first transient failure on.

        Ops recorded for another store (when `only_uri` is given) are kept untouched. Ops the store rejects
        (e.g. a param logged twice with different values) go to rejected.jsonl so they cannot block replay.
        """
        fh.seek(0)
        lines = [ln for ln in fh.read().splitlines() if ln.strip()]
        res = ReplayResult()
        keep: list[str] = []
        for i, line in enumerate(lines):
            op = json.loads(line)
            if only_uri is not None and op.get("uri") != only_uri:
                keep.append(line)
                continue
            try:
                self._apply(op)
                res.applied += 1
            except Exception as e:
                if is_transient(e):
                    keep.extend(lines[i:])
                    break
                res.rejected += 1
                log.warning("MLflow rejected a buffered %s op (%s): moved to rejected.jsonl", op.get("op"), e)
                with open(self.buffer_dir / "rejected.jsonl", "a", encoding="utf-8") as rej:
                    rej.write(json.dumps({**op, "error": str(e)[:500]}) + "\n")
        fh.seek(0)
        fh.truncate()
        if keep:
            fh.write("\n".join(keep) + "\n")
        fh.flush()
        res.left = len(keep)
        return res

    def _run_id(self, op: dict) -> str:
        rid = self.resolve(op["run_id"])
        if rid.startswith(PENDING):
            raise Blocked(f"run {rid} was created while the store was down and is not replayed yet")
        return rid

    def _experiment_id(self, name: str) -> str:
        """Get or create the experiment. A sqlite store keeps artifacts in `mlartifacts/` next to its .db
        (MLflow's own default is ./mlruns under whatever the current directory happens to be)."""
        if name not in self._experiments:
            exp = self._client.get_experiment_by_name(name)
            if exp is None:
                location = None
                if self.uri.startswith("sqlite:///"):
                    location = (Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
                with contextlib.suppress(Exception):  # lost a creation race with another process
                    self._client.create_experiment(name, artifact_location=location)
                exp = self._client.get_experiment_by_name(name)
            self._experiments[name] = exp.experiment_id
        return self._experiments[name]

    def _apply(self, op: dict) -> Any:
        from mlflow.entities import Metric, Param, RunTag

        kind = op["op"]
        c = self._client
        if kind == "create_run":
            tags = dict(op["tags"])
            parent = tags.get("mlflow.parentRunId")
            if parent:
                tags["mlflow.parentRunId"] = self._run_id({"run_id": parent})
            run = c.create_run(self._experiment_id(op["experiment"]), start_time=op["start_time"], tags=tags,
                               run_name=op["run_name"])
            rid = run.info.run_id
            if op.get("buffered_create"):
                self._ids[op["pending_id"]] = rid
                _write_id(self.buffer_dir, op["pending_id"], rid)
            return rid
        rid = self._run_id(op)
        if kind == "log_batch":
            c.log_batch(rid, metrics=[Metric(k, float(v), int(ts), int(s)) for k, v, ts, s in op["metrics"]],
                        params=[Param(k, str(v)) for k, v in op["params"].items()],
                        tags=[RunTag(k, str(v)) for k, v in op["tags"].items()])
        elif kind == "log_artifact":
            path = Path(op["path"])
            if not path.exists():   # the buffer was moved (e.g. brought back from a GPU machine): its copy
                moved = self.buffer_dir / "artifacts" / path.parent.name / path.name
                path = moved if moved.exists() else path
            if path.is_dir():
                c.log_artifacts(rid, str(path), artifact_path=op.get("artifact_path"))
            elif path.exists():
                c.log_artifact(rid, str(path), artifact_path=op.get("artifact_path"))
            else:
                log.warning("artifact %s vanished before it could be logged", path)
            if op.get("buffered"):
                shutil.rmtree(path.parent, ignore_errors=True)
        elif kind == "log_input":
            from mlflow.entities import Dataset, DatasetInput, InputTag

            ds = Dataset(name=op["name"], digest=op["digest"], source_type="local",
                         source=json.dumps({"uri": op["source"]}))
            c.log_inputs(rid, datasets=[DatasetInput(ds, tags=[InputTag("mlflow.data.context", op["context"])])])
        elif kind == "set_terminated":
            c.set_terminated(rid, status=op["status"], end_time=op["end_time"])
        else:
            raise ValueError(f"unknown buffered op {kind!r}")
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read_ids(buffer_dir: Path) -> dict[str, str]:
    try:
        return json.loads((buffer_dir / "run_ids.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_id(buffer_dir: Path, pending: str, real: str) -> None:
    buffer_dir.mkdir(parents=True, exist_ok=True)
    with open(buffer_dir / "run_ids.lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        ids = _read_ids(buffer_dir)
        ids[pending] = real
        tmp = buffer_dir / ".run_ids.json.tmp"
        tmp.write_text(json.dumps(ids, indent=1), encoding="utf-8")
        tmp.replace(buffer_dir / "run_ids.json")


def replay_dir(buffer_dir: str | Path, tracking_uri: str | None = None,
               client: BufferedClient | None = None) -> ReplayResult:
    """Replay every unlocked buffer file in `buffer_dir`, oldest first; fully replayed files are deleted.

    Ops go to the store they were recorded for, or all to `tracking_uri` when given. Passes repeat while
    they make progress (a child run may wait for its parent's create_run in a later file). With `client`
    (the in-process replay) only that client's store is replayed, once. Files locked by a live process are
    skipped and listed in `skipped_locked`.
    """
    buffer_dir = Path(buffer_dir)
    clients: dict[str, BufferedClient] = {client.uri: client} if client is not None else {}
    grand = ReplayResult()
    for n_pass in range(10):
        total = ReplayResult()
        for path in sorted(buffer_dir.glob("*.jsonl")):
            if path.name == "rejected.jsonl" or (client is not None and path == client._own_path):
                continue
            with open(path, "r+", encoding="utf-8") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    total.skipped_locked.append(path.name)
                    continue
                uris = sorted({json.loads(ln).get("uri") or "" for ln in fh.read().splitlines() if ln.strip()})
                res = ReplayResult(files=1)
                for uri in [None] if tracking_uri else uris:
                    target = tracking_uri or uri
                    if client is not None and target != client.uri:
                        continue
                    if target not in clients:
                        clients[target] = BufferedClient(target, buffer_dir)
                    with short_http(target, None):
                        part = clients[target]._replay_fh(fh, only_uri=uri)
                    res.applied += part.applied
                    res.rejected += part.rejected
                fh.seek(0)
                res.left = sum(1 for ln in fh.read().splitlines() if ln.strip())
                if res.left == 0:
                    path.unlink(missing_ok=True)
                total.add(res)
        grand.applied += total.applied
        grand.rejected += total.rejected
        grand.files = max(grand.files, total.files) if n_pass else total.files
        grand.left, grand.skipped_locked = total.left, total.skipped_locked
        if client is not None or total.applied == 0 or total.left == 0:
            break
    return grand
