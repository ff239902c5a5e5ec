"""Fixtures of the pipeline tests (helpers: pipeline_helpers.py)."""

from __future__ import annotations

import os
import time

import pytest
from pipeline_helpers import PINNED_CODE, as_args, copy_tree, run_main, tiny_corpus, tiny_settings

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
    `--json` record: stats, summary, parent run id)}. Read-only: its tests only read it (every file order sees
    the same first run); a test that runs again or writes takes `tiny_pipeline_copy`.
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
            (root / "manifest.json").write_text(json.dumps(_manifest(workdir)))
        rec = json.loads(record.read_text())
    result = subprocess.CompletedProcess(rec["args"], rec["returncode"], rec["stdout"], rec["stderr"])
    return {"root": root, "workdir": workdir, "corpus": corpus, "settings": settings, "result": result,
            "seconds": rec["seconds"], "json": root / "run.json"}


def _manifest(folder) -> dict[str, list[int]]:
    """Every file under `folder`: [size, mtime in ns]."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(folder))] = [st.st_size, st.st_mtime_ns]
    return out


@pytest.fixture(autouse=True)
def _tiny_pipeline_unchanged(request):
    """A test that used `tiny_pipeline` left its workdir as the session's run made it (a file added, changed or
    removed fails it here, naming them): so every reader sees the same run in any file order. ~5 ms a test."""
    yield
    if "tiny_pipeline" not in request.fixturenames:   # `tiny_pipeline_copy` needs it too: hard links
        return
    import json

    tiny = request.getfixturevalue("tiny_pipeline")
    want = json.loads((tiny["root"] / "manifest.json").read_text())
    have = _manifest(tiny["workdir"])
    changed = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    assert not changed, (f"{request.node.nodeid} changed the shared tiny pipeline's workdir (use "
                         f"tiny_pipeline_copy to run or write there): {changed[:20]}")


@pytest.fixture
def tiny_pipeline_copy(tiny_pipeline, tmp_path):
    """`tiny_pipeline` moved to a folder of this test's own (pipeline_helpers.copy_tree): a test that runs again in
    it, or counts runs and versions, sees the session's first run and its own changes only, in any file order.
    The same keys as `tiny_pipeline`, its paths (settings included) in the copy; ~0.2 s."""
    root = tmp_path / "tiny_pipeline"
    old, new = str(tiny_pipeline["root"]), str(root)
    copy_tree(tiny_pipeline["root"], root)
    return {**tiny_pipeline, "root": root, "workdir": root / "wd", "corpus": root / "corpus", "json": root / "run.json",
            "settings": [s.replace(old, new) for s in tiny_pipeline["settings"]]}
