"""Tracking against a real MLflow sqlite store: parent/child runs, tags, params, metrics, artifacts, datasets,
system metrics; rank ≠ 0; an unreachable store buffered and replayed through the real CLI."""

from __future__ import annotations

import json
import socket
import time

import mlflow
import pytest
from mlflow import MlflowClient

from packtrain.cli import main as cli_main
from packtrain.config import load_run_config
from packtrain.telemetry import memory
from packtrain.telemetry.meter import ThroughputMeter
from packtrain.telemetry.mfu import peak_flops, step_flops
from packtrain.telemetry.plots import plot_length_histogram
from packtrain.telemetry.report import build_report
from packtrain.telemetry.sampler import SystemSampler
from packtrain.telemetry.thresholds import TelemetryWarning
from packtrain.tracking import PARENT_ENV, end_pipeline_run, stage_run, start_pipeline_run
from packtrain.tracking.layout import system_rows
from packtrain.tracking.run_lifecycle import _clients, _close_clients, name_pipeline_run
from packtrain.versioning import git_sha


@pytest.fixture(autouse=True)
def _fresh_clients():
    yield
    _close_clients()
    _clients.clear()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module: creating an mlflow.db runs MLflow's migrations (2-8 s here).
    Each test writes to its own experiment."""
    return tmp_path_factory.mktemp("store")


def _cfg(workdir, *extra):
    return load_run_config("tiny-cpu", [f"workdir={workdir}", "tracking.system_metrics_interval_s=0.2",
                                        "tracking.flush_interval_s=0", *extra])


def _runs(uri: str, experiment: str = "packtrain") -> dict:
    mlflow.set_tracking_uri(uri)
    df = mlflow.search_runs(experiment_names=[experiment])
    return {row["tags.mlflow.runName"]: row for _, row in df.iterrows()}


def test_pipeline_with_stage_runs_in_sqlite(store, tmp_path):
    cfg = _cfg(store)
    parent = start_pipeline_run(cfg)
    docs = tmp_path / "ingest"
    docs.mkdir()
    (docs / "documents.parquet").write_bytes(b"x" * 10)
    with stage_run("ingest", cfg, section=cfg.ingest, tags={"packtrain.source": "stdlib"}) as run:
        run.log_dataset(docs, "documents", "0f343b0931126a20f133d67c2b018a3b")
        run.log_stats({"n_docs": 120, "chars": {"total": 5000, "max": 900}}, prefix="ingest.")
        run.log_json({"n_docs": 120}, "ingest_result.json")
    name_pipeline_run(cfg, "791d2730c58fc40a69c6a6a9d5b14553.dir")   # the data version ingest found

    meter = ThroughputMeter(warmup_steps=cfg.telemetry.warmup_steps)
    peak = peak_flops("cpu", "fp32", override_tflops=0.05)
    with stage_run("train", cfg, section=cfg.train) as run, SystemSampler(0.1) as sampler:
        for step in range(6):
            t0 = time.perf_counter()
            time.sleep(0.08)
            useful, dense = step_flops(100_672, 2, 64, [300, 150, 40], slot_tokens=2048, budget=512, vocab_size=4096)
            m = meter.record(step, time.perf_counter() - t0, 0.01, 490, 2048, useful, dense, peak)
            run.log_step({"loss": 8.0 - step, "lr": 1e-3, **m}, step=step)
        sampler.stop()
        with pytest.warns(TelemetryWarning):  # 490 of 2048 slots used: padding 0.76 ≥ 0.05
            report = build_report(tmp_path / "train", cfg.telemetry, meter=meter, sampler=sampler,
                                  memory=memory.cuda_memory_stats())
        report.files.append(plot_length_histogram([300, 150, 40] * 10, 0.24, tmp_path / "train" / "lengths.png",
                                                  budget=512))
        run.log_report(report)
        run.log_finals({f"throughput.{k}": report.summary[k] for k in ("steady_steps", "padding", "useful_mfu",
                                                                       "dense_mfu")})
        run.log_series(system_rows(report.samples, report.t0_unix))
    end_pipeline_run(parent)
    assert PARENT_ENV not in __import__("os").environ

    uri = f"sqlite:///{store / 'mlflow.db'}"
    runs = _runs(uri)
    assert set(runs) == {"tiny-cpu · data 791d2730", "ingest", "train"}   # the recipe and the data version
    runs["pipeline"] = runs.pop("tiny-cpu · data 791d2730")
    pid = runs["pipeline"]["run_id"]
    assert pid == parent
    for stage in ("ingest", "train"):
        r = runs[stage]
        assert r["tags.mlflow.parentRunId"] == pid and r["status"] == "FINISHED"
        assert r["tags.packtrain.stage"] == stage and r["tags.packtrain.recipe"] == "tiny-cpu"
        assert r["tags.host"] == socket.gethostname() and r["tags.packtrain.gpu"]
        if git_sha():
            assert r["tags.mlflow.source.git.commit"] == git_sha()
    assert runs["pipeline"]["params.pack.budget"] == "512" and runs["pipeline"]["params.train.lr"] == "0.003"
    assert runs["ingest"]["params.ingest.default_corpus_mb"] == "24.0"
    assert runs["ingest"]["tags.packtrain.dataset.documents.md5"] == "0f343b0931126a20f133d67c2b018a3b"
    assert runs["ingest"]["tags.packtrain.source"] == "stdlib"
    assert runs["ingest"]["metrics.ingest.chars.max"] == 900
    assert runs["train"]["params.train.max_steps"] == "30"
    assert runs["train"]["tags.packtrain.violation.padding"].startswith("0.761")

    client = MlflowClient(uri)
    tid = runs["train"]["run_id"]
    assert [m.step for m in client.get_metric_history(tid, "loss")] == list(range(6))
    assert [m.value for m in client.get_metric_history(tid, "loss")] == [8.0, 7.0, 6.0, 5.0, 4.0, 3.0]
    assert len(client.get_metric_history(tid, "useful_mfu")) == 6
    assert client.get_run(pid).info.run_name == "tiny-cpu · data 791d2730"
    data = client.get_run(tid).data.metrics
    # the final numbers once: on the pipeline run under the canonical names, in summary.json here, no chart
    finals = client.get_run(pid).data.metrics
    assert finals["train.throughput.steady_steps"] == 4
    assert finals["train.throughput.padding"] == pytest.approx(1 - 490 / 2048)
    assert 0 < finals["train.throughput.useful_mfu"] < finals["train.throughput.dense_mfu"]
    assert not [k for k in data if k.startswith(("summary.", "throughput."))], sorted(data)
    summary = json.loads(open(client.download_artifacts(tid, "summary.json", str(tmp_path / "dl"))).read())
    assert summary["throughput.steady_steps"] == 4
    assert any(k.startswith("system/cpu_utilization") for k in data), sorted(data)  # MLflow system metrics
    util = client.get_metric_history(tid, "system/train_utilization_percentage")   # the sampler's, at its time
    run_info = client.get_run(tid).info
    assert util and [m.step for m in util] == list(range(len(util)))
    assert all(run_info.start_time - 1000 <= m.timestamp <= run_info.end_time for m in util)
    arts = {a.path for a in client.list_artifacts(tid)} | {a.path for a in client.list_artifacts(tid, "plots")}
    assert {"telemetry", "plots", "plots/system.png", "plots/throughput.png", "plots/lengths.png",
            "summary.json"} <= arts
    local = client.download_artifacts(tid, "telemetry/telemetry.json", str(tmp_path / "dl"))
    assert json.loads(open(local).read())["summary"]["steps"] == 6
    iid = runs["ingest"]["run_id"]
    assert [a.path for a in client.list_artifacts(iid)] == ["ingest_result.json"]
    (ds,) = client.get_run(iid).inputs.dataset_inputs
    assert ds.dataset.name == "documents" and ds.dataset.digest == "0f343b0931126a20f133d67c2b018a3b"
    assert str(docs) in ds.dataset.source
    assert not (store / "mlflow-buffer").exists()  # nothing was buffered
    assert (store / "mlartifacts" / tid).is_dir()  # artifacts next to the .db, not in the cwd


def test_failing_stage_is_marked_failed(store):
    cfg = _cfg(store, "tracking.system_metrics=false", "tracking.experiment=failing")
    with pytest.raises(RuntimeError, match="boom"), stage_run("pack", cfg, section=cfg.pack):
        raise RuntimeError("boom")
    runs = _runs(f"sqlite:///{store / 'mlflow.db'}", "failing")
    assert runs["pack"]["status"] == "FAILED" and mlflow.active_run() is None


def test_nonzero_rank_and_disabled_tracking_log_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    cfg = _cfg(tmp_path)
    assert start_pipeline_run(cfg) is None
    with stage_run("train", cfg, section=cfg.train) as run:
        run.log_step({"loss": 1.0}, step=0)
        run.log_metrics({"x": 1.0})
    assert not run.enabled and run.run_id is None
    monkeypatch.setenv("RANK", "0")
    with stage_run("train", _cfg(tmp_path, "tracking.enabled=false")) as run:
        run.log_metrics({"x": 1.0})
    assert not run.enabled
    assert not (tmp_path / "mlflow.db").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_store_buffers_then_cli_replays(store, tmp_path, monkeypatch, capsys):
    """Nothing listens on the port: every op lands in the buffer fast; `packtrain mlflow replay` sends it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    cfg = _cfg(tmp_path, "tracking.retry_after_s=0.05", "tracking.experiment=buffered")
    parent = start_pipeline_run(cfg)
    assert parent.startswith("pending-")
    slowest = 0.0
    with stage_run("train", cfg, section=cfg.train) as run:
        for step in range(20):
            t0 = time.perf_counter()
            run.log_step({"loss": 1.0 / (step + 1)}, step=step)
            slowest = max(slowest, time.perf_counter() - t0)
            time.sleep(0.005)
        run.log_json({"steps": 20}, "train_result.json")
        run.set_tags({"packtrain.note": "buffered"})
        assert run.client.down
    end_pipeline_run(parent)
    assert slowest < 1.0  # a dead server never stalls a step (measured ~2 ms for a refused connection)
    buf = tmp_path / "mlflow-buffer"
    assert len(list(buf.glob("*.jsonl"))) == 1

    target = f"sqlite:///{store / 'mlflow.db'}"  # replay into another store than the one recorded
    replay = ["mlflow", "replay", "--set", f"workdir={tmp_path}", "--tracking-uri", target]
    assert cli_main(replay) == 1  # the buffer file is still held by this process's open client
    assert "in use by a running process" in capsys.readouterr().err
    _close_clients()  # what process exit does
    capsys.readouterr()
    assert cli_main(replay) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["applied"] > 0 and out["left"] == 0 and out["rejected"] == 0
    assert not list(buf.glob("*.jsonl"))

    runs = _runs(target, "buffered")
    runs["pipeline"] = runs.pop("tiny-cpu")   # named after the recipe (no data version known here)
    assert runs["train"]["tags.mlflow.parentRunId"] == runs["pipeline"]["run_id"]
    assert runs["train"]["status"] == "FINISHED" and runs["pipeline"]["status"] == "FINISHED"
    assert runs["train"]["tags.packtrain.note"] == "buffered"
    client = MlflowClient(target)
    assert [m.step for m in client.get_metric_history(runs["train"]["run_id"], "loss")] == list(range(20))
    assert [a.path for a in client.list_artifacts(runs["train"]["run_id"])] == ["train_result.json"]


def test_replay_cli_bad_buffer_dir(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cli_main(["mlflow", "replay", "--buffer", str(missing)]) == 5
    assert f"--buffer {missing}: no such directory" in capsys.readouterr().err
    assert not missing.exists()
    # the default buffer of a workdir that never buffered: nothing to do
    assert cli_main(["mlflow", "replay", "--set", f"workdir={tmp_path}"]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] == 0
