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

A fresh store is not migrated in place: under the lock it is copied from a template, an empty store that
MLflow's own `_initialize_tables` (the same create_all + alembic upgrade it runs on a fresh store) made once per
(MLflow version, alembic head, SQLAlchemy version, sqlite version), kept under the user cache
(`$PACKTRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/packtrain`, else `~/.cache/packtrain`:
`mlflow-store-templates/mlflow-3.17.2-dc11669786a5-sa2.1.9-sqlite3.40.1.db`). A copy opens in ~0.1 s where the
migrations take 1.5-2.7 CPU-s per store (one per workdir, test and bench tree). The template holds the tables,
`alembic_version` at the head and the `workspaces` row a migration inserts, and no experiment: the first client
to open the copy creates the Default experiment (id 0) itself, with its own artifact root and clock, as on a
migrated store. MLflow checks the head on every open (`_verify_schema`), so a stale template fails loudly, and
any failure to make or copy one (a read-only home in a container) falls back to MLflow's own creation.
"""

from __future__ import annotations

import fcntl
import os
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
            if not db.exists():
                copy_template(db)
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


def store_template() -> Path | None:
    """The empty store template of the installed MLflow (module doc), made under a file lock by whoever asks
    first and published by a rename (never seen half-written); None when it cannot be made or read."""
    import sqlite3

    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _get_latest_schema_revision

    from packtrain.paths import user_cache_dir

    head = _get_latest_schema_revision()
    folder = user_cache_dir() / "mlflow-store-templates"
    path = folder / f"mlflow-{mlflow.__version__}-{head}-sa{sqlalchemy.__version__}-sqlite{sqlite3.sqlite_version}.db"
    if path.is_file():
        return path
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(store_lock_path(path), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)   # one process migrates (seconds), the others then copy
            if not path.is_file():
                _migrate_empty(part, head)
                os.replace(part, path)
    except Exception:   # no cache (read-only home, full disk): MLflow creates the store itself
        _discard(part)
        return None
    return path


def _migrate_empty(db: Path, head: str) -> None:
    """An empty store at `db` made by MLflow's own schema creation (tables + alembic upgrade to `head`)."""
    import sqlalchemy
    from mlflow.store.db.utils import _get_schema_version, _initialize_tables

    db.unlink(missing_ok=True)
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        _initialize_tables(engine)
        if _get_schema_version(engine) != head:
            raise RuntimeError(f"{db}: schema not at alembic head {head}")
    finally:
        engine.dispose()


def copy_template(db: Path) -> bool:
    """Put a copy of the store template at `db` (absent; the caller holds its lock): copied beside it, then
    renamed into place, so a crash leaves no half store. False (nothing written) when there is no template."""
    from packtrain.publish import atomic_copy_file

    template = store_template()
    if template is None:
        return False
    try:
        atomic_copy_file(template, db)
    except OSError:
        return False
    return True


def _discard(part: Path) -> None:
    try:
        part.unlink(missing_ok=True)
    except OSError:   # its folder is not there (or not a folder): nothing to remove
        pass
