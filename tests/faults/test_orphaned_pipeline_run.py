"""kill -9 of `packtrain run` leaves no run RUNNING: the pipeline run carries owner tags like its stage runs, and
the next `packtrain run` marks both the killed stage run and the killed pipeline run KILLED when it opens its own
pipeline run (before, the parent stayed RUNNING forever: no owner tags, the sweep skipped it). A real `packtrain run`
process (forked from this one, tests/forked.py: its own pid, the owner its runs name) killed while ingest publishes (fault point publish@1: SIGKILL, as `kill -9`), real sqlite MLflow; the
rerun is a `packtrain run` whose validation then fails (min_rows too high: ~3 s instead of a whole pipeline)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from forked import Forked

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))   # any file order: not only after tests/pipelines
from pipeline_helpers import PINNED_CODE, as_args, run_main, tiny_corpus, tiny_settings  # noqa: E402

from packtrain.cli import main
from packtrain.tracking import owner


def _runs(db) -> list:
    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{db}")
    exp = c.get_experiment_by_name("packtrain")
    return c.search_runs([exp.experiment_id]) if exp else []


def test_a_killed_packtrain_run_leaves_no_pipeline_run_running(tmp_path):
    corpus, wd = tiny_corpus(tmp_path / "corpus"), tmp_path / "wd"
    settings = tiny_settings(wd, corpus)
    env = {**os.environ, "PACKTRAIN_FAULT": "publish@1", "PACKTRAIN_CODE_VERSION": PINNED_CODE}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PACKTRAIN_PARENT_RUN_ID", None)
    log = tmp_path / "killed.log"
    # `packtrain run` through the CLI's main, as Forked(["run", ...]) runs it, without its preload of torch and
    # transformers into this process: a run killed at ingest imports neither
    killed = Forked(lambda: main(["run", *as_args(settings)]), env, log, cwd=tmp_path)
    assert killed.wait(timeout=300) == -9, log.read_text()[-2000:]
    before = {r.info.run_name: r for r in _runs(wd / "mlflow.db")}
    parent = next(r for r in before.values() if r.data.tags.get("packtrain.kind") == "pipeline")
    assert parent.info.status == before["ingest"].info.status == "RUNNING"
    assert parent.data.tags[owner.PID] == str(killed.pid)   # the owner, as on every stage run
    r = run_main(["run", *as_args([*settings, "validate.min_rows=100000"])], cwd=tmp_path)
    assert r.returncode == 4, r.stderr[-2000:]   # the rerun itself failed validation: ended FAILED, not left RUNNING
    after = {x.info.run_id: x for x in _runs(wd / "mlflow.db")}
    for old in (parent, before["ingest"]):
        run = after[old.info.run_id]
        assert run.info.status == "KILLED", (old.info.run_name, run.info.status)
        assert "is gone: killed (SIGKILL, OOM)" in run.data.tags[owner.REASON]
    assert "opening pipeline run" in after[parent.info.run_id].data.tags[owner.REASON]
    assert f"MLflow run {parent.info.run_id}" in r.stderr
    assert not [x for x in after.values() if x.info.status == "RUNNING"]
