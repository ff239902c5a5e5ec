"""`packtrain gate` on the run tree a real `packtrain run` made (the session's `tiny_pipeline`, sqlite store):
the pipeline run id and `packtrain-lm@champion` resolve to the same train stage run and pass, and every metric
name in docs/gate.md's rules example exists in a real run — this CPU run, or, for the GPU-only ones, the
recorded H200 train run (bench/results/train_350m_h200_mlflow_run.json, loaded into a fresh sqlite MLflow
store)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from pipeline_helpers import REPO

from packtrain.cli import main

pytestmark = pytest.mark.slow


H200_RUN = REPO / "bench" / "results" / "train_350m_h200_mlflow_run.json"


def _load_recorded_run(client, path) -> str:
    """A run exported from a real MLflow store (experiment, run name, tags, params, each metric's latest value
    at its step and time) created again through `client`; returns the new run id."""
    rec = json.loads(path.read_text(encoding="utf-8"))
    from mlflow.entities import Metric, Param, RunTag

    exp = client.create_experiment(rec["experiment"])
    run = client.create_run(exp, start_time=rec["start_time"], run_name=rec["run_name"])
    rid = run.info.run_id
    client.log_batch(rid, metrics=[Metric(k, m["value"], m["timestamp"], m["step"]) for k, m in rec["metrics"].items()],
                     params=[Param(k, v) for k, v in rec["params"].items()],
                     tags=[RunTag(k, v) for k, v in rec["tags"].items()])
    client.set_terminated(rid, rec["status"], end_time=rec["end_time"])
    return rid


def _rules_example() -> dict:
    """The YAML block under '### Rules files' in docs/gate.md."""
    text = (REPO / "docs" / "gate.md").read_text(encoding="utf-8")
    section = text.split("### Rules files", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)


@pytest.fixture(scope="module")
def pipeline_tree(tiny_pipeline):
    from mlflow import MlflowClient

    assert tiny_pipeline["result"].returncode == 0, tiny_pipeline["result"].stderr[-3000:]
    uri = f"sqlite:///{tiny_pipeline['workdir'] / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`packtrain.kind` = 'pipeline'", order_by=["attributes.start_time ASC"])
    return {"uri": uri, "pipeline": runs[0].info.run_id, "client": client}


def test_champion_is_the_training_run_of_the_pipeline(pipeline_tree, tmp_path, capsys):
    from packtrain.gate import load_source

    uri, pid = pipeline_tree["uri"], pipeline_tree["pipeline"]
    by_run, by_alias = load_source(pid[:8], uri), load_source("packtrain-lm@champion", uri)
    assert by_run.run_id == by_alias.run_id and "(train of pipeline" in by_alias.label
    assert by_run.device == "cpu" and by_run.scheme == "packtrain"
    assert main(["gate", "--set", f"tracking.tracking_uri={uri}", "--candidate", pid[:8], "--baseline",
                 "packtrain-lm@champion", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gate.json").read_text())
    assert {"pack.fill", "train.throughput.real_tokens_per_s", "train.system.utilization"} <= \
        {r["metric"] for r in res["rows"]}
    print(capsys.readouterr().out)


def test_rules_example_names_exist_in_a_real_run(pipeline_tree, tmp_path):
    """The documented rules once named train.tokens_per_s / train.useful_mfu, which no run has (exit 2). Every
    name now exists in this `packtrain run`'s tree or in the recorded H200 train run."""
    from packtrain.gate.metric_sources import load_run, load_source

    names = set(_rules_example()["metrics"])
    cpu = load_source(pipeline_tree["pipeline"], pipeline_tree["uri"]).metrics
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'h200.db'}")   # a fresh store
    gpu = load_run(client, _load_recorded_run(client, H200_RUN)).metrics
    assert "train.memory.fragmentation" in gpu and "train.throughput.real_tokens_per_s" in gpu
    missing = sorted(n for n in names if n not in cpu and n not in gpu)
    assert not missing, f"docs/gate.md's rules example names metrics no real run has: {missing}"
    assert len(names) >= 6
