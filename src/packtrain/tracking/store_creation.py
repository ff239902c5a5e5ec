"""Creating an MLflow store once, whoever asks first: store creation serialised across processes.

MLflow creates the tables of a new sqlite store (and runs its ~50 alembic migrations, ~2 s on the CPU) the first
time a client touches it, with no lock: two processes opening one fresh store at once both migrate it, and one
crashes (`table latest_metrics already exists`, `duplicate column name: step`, alembic's "Online migration expected
to match one row") — measured here 4 times out of 4 with two processes started together. Its registration or
run is lost.

`ensure_store(uri)` takes an exclusive flock on a file beside the sqlite file (`<dir>/.<name>.packtrain-lock`, kept:
a lock file removed while another process waits on it would let a third in), creates the tracking and registry
stores under it (a no-op on a store that exists), and remembers the URI for the process. The second process waits
(seconds, while the first migrates), then finds the tables made and migrates nothing. Every BufferedClient calls
it before its first op (packtrain.tracking.buffer), and so do the registry readers that may be first to open a
store. A server URI (http/https) needs no lock here: the server owns its store; an op that meets a 5xx while it
starts is buffered and replayed (packtrain.tracking.buffer).
"""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

_ready: set[str] = set()
_guard = threading.Lock()


def sqlite_path(uri: str | None) -> Path | None:
    """The file of a `sqlite:///` URI (None for any other store).

    >>> sqlite_path("sqlite:////abs/data/mlflow.db"), sqlite_path("http://host:5000")
    (PosixPath('/abs/data/mlflow.db'), None)
    """
    if not uri or not uri.startswith("sqlite:///"):
        return None
    rest = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def store_lock_path(db: Path) -> Path:
    """`/abs/data/mlflow.db` → `/abs/data/.mlflow.db.packtrain-lock`."""
    return db.parent / f".{db.name}.packtrain-lock"


def ensure_store(uri: str) -> None:
    """Make sure the MLflow store at `uri` exists with its schema, creating it under a file lock when it is a
    sqlite file (module doc). Once per URI per process; other URIs: nothing."""
    db = sqlite_path(uri)
    if db is None or uri in _ready:
        return
    with _guard:
        if uri in _ready:
            return
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(store_lock_path(db), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)   # blocks while another process creates the store (seconds)
            from mlflow import MlflowClient

            from packtrain.tracking.transport import is_transient

            try:
                client = MlflowClient(tracking_uri=uri, registry_uri=uri)
                client.search_experiments(max_results=1)          # the tracking store: tables + migrations
                client.search_registered_models(max_results=1)    # the registry store (same file, its tables)
            except Exception as e:
                if not is_transient(e):   # "database is locked": the caller's own ops buffer and retry
                    raise
                return
        _ready.add(uri)
