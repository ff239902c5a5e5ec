"""A real `mlflow server` stopped mid-run and restarted: every metric, tag, artifact and run arrives.

One server test only: `mlflow server` takes ~10-20 s to start on a loaded 2-core machine, twice here.
"""

from __future__ import annotations

import time

import pytest
from forked import run_forked
from mlflow import MlflowClient
from mlflow_server import Server, free_port

from packtrain.config import load_run_config
from packtrain.tracking import end_pipeline_run, stage_run, start_pipeline_run
from packtrain.tracking.run_lifecycle import _clients, _close_clients

pytestmark = pytest.mark.slow


def _child_stage(workdir: str) -> int:
    """A stage in another process (as under kfp.local / Airflow: forked, tests/forked.py, with tracking clients of
    its own): inherits MLFLOW_TRACKING_URI and the parent id."""
    cfg = load_run_config("tiny-cpu", [f"workdir={workdir}", "tracking.system_metrics=false"])
    with stage_run("validate", cfg, section=cfg.validate_) as run:
        run.log_metrics({"n_failed": 0})
    return 0


def test_server_down_mid_run_then_back(tmp_path, monkeypatch):
    from packtrain.tracking.store_creation import copy_template

    # the server's store, empty: a copy of the store template, so its first start need not migrate a fresh one
    copy_template(tmp_path / "server.db")
    server = Server(tmp_path, free_port(), db=tmp_path / "server.db")
    server.start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path / 'work'}", "tracking.flush_interval_s=0",
                                           "tracking.retry_after_s=0.1", "tracking.system_metrics=false"])
        parent = start_pipeline_run(cfg)
        assert not parent.startswith("pending-")
        with stage_run("train", cfg, section=cfg.train) as train:
            for step in range(5):  # live
                train.log_step({"loss": 10.0 - step}, step=step)
            server.stop()  # crash mid-run
            slowest = 0.0
            for step in range(5, 15):  # buffered
                t0 = time.perf_counter()
                train.log_step({"loss": 10.0 - step}, step=step)
                slowest = max(slowest, time.perf_counter() - t0)
                time.sleep(0.02)
            train.log_json({"steps": 15}, "train_result.json")
            train.set_tags({"packtrain.outage": "yes"})
            assert train.client.down
        # another process logs a whole stage while the server is down and exits: its buffer file stays
        log = tmp_path / "child.log"
        assert run_forked(lambda: _child_stage(str(tmp_path / "work")), log=log, timeout=120) == 0, log.read_text()
        assert len(list((tmp_path / "work" / "mlflow-buffer").glob("*.jsonl"))) == 2  # ours + the child's
        with stage_run("evaluate", cfg, section=cfg.evaluate) as ev:  # created while the server is down
            assert ev.run_id.startswith("pending-")
            ev.log_step({"eval_loss": 3.5}, step=0)
            server.start()  # back, same store
            time.sleep(0.15)  # past retry_after_s
            ev.log_step({"eval_loss": 3.25}, step=1)  # the next call replays the backlog first
            assert not ev.client.down and not ev.run_id.startswith("pending-")
        end_pipeline_run(parent)
        assert slowest < 1.0  # a dead server costs one refused connection, not MLflow's minutes of retries

        client = MlflowClient(server.uri)
        tid = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id],
                                 "tags.mlflow.runName = 'train'")[0].info.run_id
        history = client.get_metric_history(tid, "loss")
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(15))  # nothing lost
        run = client.get_run(tid)
        assert run.info.status == "FINISHED" and run.data.tags["packtrain.outage"] == "yes"
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.params["train.max_steps"] == "30"
        assert [a.path for a in client.list_artifacts(tid)] == ["train_result.json"]
        (ev_run,) = client.search_runs([run.info.experiment_id], "tags.mlflow.runName = 'evaluate'")
        assert ev_run.data.tags["mlflow.parentRunId"] == parent and ev_run.info.status == "FINISHED"
        assert [m.value for m in client.get_metric_history(ev_run.info.run_id, "eval_loss")] == [3.5, 3.25]
        assert client.get_run(parent).info.status == "FINISHED"
        (val,) = client.search_runs([run.info.experiment_id], "tags.mlflow.runName = 'validate'")
        assert val.data.tags["mlflow.parentRunId"] == parent and val.data.metrics["n_failed"] == 0
        _close_clients()
        assert not list((tmp_path / "work" / "mlflow-buffer").glob("*.jsonl"))
    finally:
        _close_clients()
        _clients.clear()
        server.stop()
