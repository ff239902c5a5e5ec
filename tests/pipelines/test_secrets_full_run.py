"""Secrets never reach disk or output, through the whole DAG: `packtrain run --json` with the tracking server
down and credentials in MLFLOW_TRACKING_URI (userinfo) and MLFLOW_TRACKING_PASSWORD, then `packtrain mlflow
replay` into a real sqlite store. After each, every file under the test's directory (workdir, KFP artifacts,
stage cache, buffer, logs, the --json file, the MLflow store and its artifacts) and every captured stdout/stderr
is searched for the planted secrets: zero hits. The run itself finishes (exit 0) with the registration deferred,
and the replay registers exactly one version."""

from __future__ import annotations

import json
import re
import socket
import uuid
from pathlib import Path

import pytest
from pipeline_helpers import as_args, run_forked_cli, tiny_corpus, tiny_settings

pytestmark = pytest.mark.slow


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # closed again: connections are refused


def _hits(root: Path, outputs: list[str], secrets: list[str]) -> list[str]:
    found = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            found += [f"{p}: {s[:4]}…" for s in secrets if s.encode() in data]
    for i, text in enumerate(outputs):
        found += [f"output #{i}: {s[:4]}…" for s in secrets if s in text]
    return found


def test_full_run_with_the_server_down_and_replay_leak_no_secret(tmp_path):
    password, token = f"pw-{uuid.uuid4().hex}", f"tok-{uuid.uuid4().hex}"
    uri = f"http://alice:{password}@127.0.0.1:{_dead_port()}"
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_PASSWORD": token, "MLFLOW_TRACKING_USERNAME": "alice",
           "PACKTRAIN_FAULT": ""}
    corpus = tiny_corpus(tmp_path / "corpus", n_docs=40)
    work = tmp_path / "wd"
    settings = [*tiny_settings(work, corpus), "tracking.retry_after_s=60", f"tracking.buffer_dir={tmp_path / 'buf'}"]
    # a process of its own, as a user runs it: replay skips buffer files whose writer process is still alive (forked
    # from this one, the replay too: tests/forked.py, a fresh interpreter's imports were ~10 of ~26 CPU-s here)
    run = run_forked_cli(["run", *as_args(settings), "--json", str(tmp_path / "run.json")], cwd=tmp_path, env=env,
                  timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["stages"]["register"]["decision"] == "deferred"
    assert "alice:***@127.0.0.1" in result["tracking_uri"]
    assert "deferred" in run.stdout
    # a store that refuses connections answers at once: evaluate's champion lookup (the stage cache key) once
    # went through MLflow's own retries and took ~250 s here (now ~5 s)
    (evaluate_s,) = [float(m) for m in re.findall(r"^\[6/7\] evaluate\s+success in ([\d.]+) s", run.stdout, re.M)]
    assert evaluate_s < 120, run.stdout
    outputs = [run.stdout, run.stderr]
    assert _hits(tmp_path, outputs, [password, token]) == []

    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    rep = run_forked_cli(["mlflow", "replay", "--buffer", str(tmp_path / "buf"), "--tracking-uri", store,
                   "--set", f"workdir={work}"], cwd=tmp_path, env={"MLFLOW_TRACKING_PASSWORD": token})
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "alice:***@127.0.0.1" in rep.stderr                 # which store the ops were recorded for
    outputs += [rep.stdout, rep.stderr]
    assert _hits(tmp_path, outputs, [password, token]) == []

    from mlflow import MlflowClient

    client = MlflowClient(store)
    versions = client.search_model_versions("name='packtrain-lm'")
    assert len(versions) == 1 and str(client.get_model_version_by_alias("packtrain-lm", "champion").version) == "1"
    runs = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])
    names = sorted(r.info.run_name for r in runs)
    assert names.count("train") == 1 and names.count("register") == 1
    # the layout survives the outage (docs/tracking.md "The MLflow layout"): the buffered rename and the deferred
    # registration, applied by the replay, name the pipeline run by its data version and give the model to the train run
    (train,) = [r for r in runs if r.info.run_name == "train"]
    (parent,) = [r for r in runs if r.data.tags.get("packtrain.kind") == "pipeline"]
    data_version = result["stages"]["ingest"]["lineage"]["data_version"]
    assert parent.info.run_name == f"tiny-cpu · data {data_version[:8]}"
    assert versions[0].run_id == train.info.run_id
    assert [o.model_id for o in train.outputs.model_outputs] == [versions[0].source.removeprefix("models:/")]
