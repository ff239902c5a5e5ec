"""Fixtures of the pipeline tests (helpers: pipeline_helpers.py)."""

from __future__ import annotations

import os
import time

import pytest
from pipeline_helpers import PINNED_CODE, as_args, run_main, tiny_corpus, tiny_settings

from packtrain.testing.tiny_corpus import WORDORDER_SUITE


@pytest.fixture
def pinned_code(monkeypatch):
    """The shared tree changes under the tests (other people edit packtrain): pin the stage cache's code
    part so that 'unchanged code' really is unchanged for the duration of a test."""
    monkeypatch.setenv("PACKTRAIN_CODE_VERSION", PINNED_CODE)
    return PINNED_CODE


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """One full `packtrain run` (the default in-process runner, through the CLI's entry point in this process)
    on tiny data, shared by the local-pipeline and Airflow tests (the Airflow DAG's local run then restores every
    stage from this run's stage cache instead of training again).

    Runs once per test session even under pytest-xdist: the first worker that needs it runs it under a file
    lock in the directory all workers share; the others wait and reuse its record.

    Returns {"root", "workdir", "corpus", "settings", "result" (CompletedProcess), "seconds", "json" (the run's
    `--json` record: stats, summary, parent run id, as they were right after this run; later tests run again in
    the same workdir)}.
    """
    import fcntl
    import json
    import subprocess

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent   # the base temp dir of the whole session, the same for every worker
    root = shared / "tiny_pipeline"
    root.mkdir(exist_ok=True)
    with open(shared / "tiny_pipeline.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = root / "record.json"
        corpus, workdir = root / "corpus", root / "wd"
        settings = [*tiny_settings(workdir, corpus), WORDORDER_SUITE]   # the recipe's task suite, as make run has
        if not record.exists():
            tiny_corpus(corpus)
            t0 = time.perf_counter()
            r = run_main(["run", *as_args(settings), "--progress", "0", "--json", str(root / "run.json")],
                         cwd=root)   # every progress line
            record.write_text(json.dumps({"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                                          "args": r.args, "seconds": time.perf_counter() - t0}))
        rec = json.loads(record.read_text())
    result = subprocess.CompletedProcess(rec["args"], rec["returncode"], rec["stdout"], rec["stderr"])
    return {"root": root, "workdir": workdir, "corpus": corpus, "settings": settings, "result": result,
            "seconds": rec["seconds"], "json": root / "run.json"}
