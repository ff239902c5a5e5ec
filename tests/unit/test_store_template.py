"""A fresh sqlite store copied from the store template (packtrain.tracking.store_creation) is the store MLflow makes
itself: the same tables, indexes and constraints, alembic_version at the head, the same rows (the `workspaces`
row a migration inserts, the Default experiment the first client adds: its artifact location from the opener's
working directory), only the Default experiment's creation time differs. Real MLflow, real sqlite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mlflow import MlflowClient


def _schema_and_rows(db: Path) -> tuple[dict, dict]:
    """{name: sorted lines of its CREATE statement}, {table: sorted rows}. Lines sorted because MLflow's own
    migrations write a table's constraints in an order that varies from process to process (the `runs` CHECKs
    differed between two plain MLflow stores made with PYTHONHASHSEED 1 and 2)."""
    con = sqlite3.connect(db)
    try:
        objects = con.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
        schema = {(t, n): sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())
                  for t, n, sql in objects}
        rows = {n: sorted(con.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr)
                for t, n, _ in objects if t == "table"}
    finally:
        con.close()
    return schema, rows


def test_a_copied_store_is_the_store_mlflow_migrates(tmp_path, monkeypatch):
    from mlflow.store.db.utils import _get_latest_schema_revision

    from packtrain.tracking.store_creation import ensure_store, store_template

    monkeypatch.chdir(tmp_path)   # both Default experiments: artifacts under ./mlruns, nothing written there yet
    template = store_template()
    assert template is not None and _get_latest_schema_revision() in template.name
    copied, migrated = tmp_path / "copied" / "mlflow.db", tmp_path / "migrated" / "mlflow.db"
    ensure_store(f"sqlite:///{copied}")
    migrated.parent.mkdir()
    uri = f"sqlite:///{migrated}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()   # MLflow's own creation

    (s_copied, r_copied), (s_migrated, r_migrated) = _schema_and_rows(copied), _schema_and_rows(migrated)
    assert s_copied == s_migrated and len(s_copied) > 40
    (d_copied,), (d_migrated,) = r_copied.pop("experiments"), r_migrated.pop("experiments")
    assert r_copied == r_migrated
    assert r_copied["alembic_version"] == [(_get_latest_schema_revision(),)]
    assert d_copied[:4] == d_migrated[:4] == (0, "Default", str(tmp_path / "mlruns" / "0"), "active")
    assert d_copied[6:] == d_migrated[6:]   # the workspace; [4:6] the creation and update times
    assert not (tmp_path / "mlruns").exists()


def test_no_cache_no_template_nothing_written(tmp_path, monkeypatch):
    """A cache that cannot be made (a read-only home in a container): no template, and ensure_store leaves the
    store to MLflow's own creation (copy_template writes nothing)."""
    from packtrain.tracking.store_creation import copy_template, store_template

    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("PACKTRAIN_CACHE_DIR", str(tmp_path / "not-a-dir"))
    assert store_template() is None
    assert copy_template(tmp_path / "store" / "mlflow.db") is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]
