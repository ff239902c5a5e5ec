"""Helpers of the pipeline tests: a tiny real-text corpus and the settings that make a whole
pipeline run take seconds of compute (the rest is process start-up: ~3 s a stage on this machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings  # noqa: F401 - the tests' helpers

REPO = Path(__file__).resolve().parents[2]
PINNED_CODE = "test-pinned"
"""PACKTRAIN_CODE_VERSION of every pipeline run in these tests: the shared tree changes under them (other
people edit packtrain), and 'unchanged code' must stay unchanged for the stage cache during a test."""
PACKTRAIN = Path(sys.executable).with_name("packtrain")


def as_args(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


def run_main(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`packtrain ARGS` through the CLI's entry point in this process (a `packtrain` process costs ~6 s of imports
    on 2 cores; `packtrain run` runs its stages in process by default), in `cwd`, with the environment `run_cli`
    gives its process; returns what `run_cli` returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from packtrain.cli import main
    from packtrain.paths import patched_env

    out, err = io.StringIO(), io.StringIO()
    values = {"PACKTRAIN_CODE_VERSION": PINNED_CODE, "MLFLOW_TRACKING_URI": None, "PACKTRAIN_PARENT_RUN_ID": None,
              **(env or {})}
    before = os.getcwd()
    try:
        with patched_env(**{k: (v or None) for k, v in values.items()}), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            os.chdir(cwd)
            code = main(list(args))
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["packtrain", *args], code, out.getvalue(), err.getvalue())


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """The real `packtrain` console script of this venv in a subprocess."""
    full_env = {**os.environ, "PACKTRAIN_CODE_VERSION": PINNED_CODE}
    full_env.pop("MLFLOW_TRACKING_URI", None)   # the session's, never a test's own (given in `env`)
    full_env.pop("PACKTRAIN_PARENT_RUN_ID", None)
    full_env.update(env or {})
    return subprocess.run([str(PACKTRAIN), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def run_forked_cli(args: list[str], cwd: Path, env: dict | None = None,
                   timeout: int = 600) -> subprocess.CompletedProcess:
    """`packtrain ARGS` as `run_cli` runs it (a process of its own, in `cwd`, with run_cli's environment; what it
    returns), forked from this process (tests/forked.py): without a fresh interpreter's ~6 CPU-s of imports."""
    import tempfile

    from forked import run_forked

    full_env = {**os.environ, "PACKTRAIN_CODE_VERSION": PINNED_CODE}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env.pop("PACKTRAIN_PARENT_RUN_ID", None)
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="packtrain-forked-") as d:
        out, err = Path(d) / "stdout", Path(d) / "stderr"
        code = run_forked(list(args), full_env, out, timeout=timeout, err=err, cwd=cwd)
        return subprocess.CompletedProcess(["packtrain", *args], code, out.read_text() if out.exists() else "",
                                           err.read_text() if err.exists() else "")


# the write-once stores of a workdir (the stage cache, the DVC remote, MLflow's artifacts, each run's folder): a new
# run adds files there and never rewrites one, so a copy may share their files (hard links)
_LINKED = ("cache", "dvc-remote", "mlartifacts", "kfp")


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a tiny pipeline's folder `src` (corpus, workdir, records) to `dst` as if it had been made there: every
    absolute path `src/...` inside a text file or an sqlite store (MLflow's artifact locations, the stage cache's
    entries, DVC's remote) now reads `dst/...`. Files of the write-once stores that name no path are hard links
    (~2/3 of the bytes); everything else is a real copy, sqlite stores above all (written in place)."""
    import shutil
    import sqlite3

    old, new = str(src).encode(), str(dst).encode()
    for path in sorted(src.rglob("*")):
        to = dst / path.relative_to(src)
        if path.is_dir():
            to.mkdir(parents=True, exist_ok=True)
            continue
        data = path.read_bytes()
        if data.startswith(b"SQLite format 3\0"):
            with sqlite3.connect(path) as a, sqlite3.connect(to) as b:
                a.backup(b)
            _replace_in_sqlite(to, old.decode(), new.decode())
        elif old in data and _is_text(data):
            to.write_bytes(data.replace(old, new))
        elif path.relative_to(src).parts[1:2] and path.relative_to(src).parts[1] in _LINKED:
            os.link(path, to)
        else:
            shutil.copy2(path, to)
    for entry in dst.glob("*/cache/*/*/entry.json"):
        _rekey(entry, old.decode(), new.decode())


def _rekey(entry_json: Path, old: str, new: str) -> None:
    """A stage cache entry whose key parts named a path under `old` (register's: the workdir and the tracking URI)
    moves to the key those parts have under `new`, as a run there would have stored it. The key is computed as
    packtrain.pipeline.cache.stage_cache_key computes it from its parts; an entry whose stored key does not match
    its own parts that way fails here, naming the function to follow."""
    import hashlib
    import json

    def key(parts: dict) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    data = json.loads(entry_json.read_text(encoding="utf-8"))
    before = json.loads(json.dumps(data["parts"]).replace(json.dumps(new)[1:-1], json.dumps(old)[1:-1]))
    assert key(before) == data["key"] == entry_json.parent.name, \
        f"{entry_json}: its key is not sha256 of its parts: follow stage_cache_key (packtrain.pipeline.cache)"
    if key(data["parts"]) != data["key"]:
        data["key"] = key(data["parts"])
        entry_json.write_text(json.dumps(data, indent=2), encoding="utf-8")
        entry_json.parent.rename(entry_json.parent.with_name(data["key"]))


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _replace_in_sqlite(db: Path, old: str, new: str) -> None:
    """`old` → `new` in every text column of every table of `db`."""
    import sqlite3

    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for col in con.execute(f'PRAGMA table_info("{table}")').fetchall():
                if col[2].upper() in ("TEXT", "") or "CHAR" in col[2].upper():
                    con.execute(f'UPDATE "{table}" SET "{col[1]}" = replace("{col[1]}", ?, ?) '
                                f'WHERE "{col[1]}" LIKE ?', (old, new, f"%{old}%"))
