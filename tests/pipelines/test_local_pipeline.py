"""`packtrain run` end to end: the whole KFP DAG through kfp.local.SubprocessRunner on tiny data.

One workdir, three runs: (1) a failing validation stops before training, exit 4, report path printed;
(2) the full DAG: summary, parent + 7 stage runs in MLflow, a registered version with the champion alias;
(3) unchanged data/config/code: every stage restored from the stage cache, fast, still logged.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from pipeline_helpers import as_args, run_cli, tiny_corpus, tiny_settings

from packtrain import STAGES

pytestmark = pytest.mark.slow


def _runs(db: Path):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("packtrain")
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"], max_results=500)


def test_local_pipeline_fail_run_cache(tmp_path, pinned_code):
    corpus = tiny_corpus(tmp_path / "corpus")
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    wd = tmp_path / "wd"
    base = as_args(tiny_settings(wd, corpus))

    # (1) validation fails (needs 10,000 rows, has 60): the DAG stops before tokenize/train
    r = run_cli(["run", *base, "--set", "validate.min_rows=10000"], cwd=tmp_path)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "stage validate failed" in r.stderr and "Traceback" not in r.stderr
    reports = [Path(p) for p in re.findall(r"(/\S+?\.(?:json|html))", r.stderr)]
    assert reports and all(p.exists() for p in reports), r.stderr
    assert not list((wd / "kfp").glob("*/train")) and not list((wd / "kfp").glob("*/tokenize"))
    client, runs = _runs(wd / "mlflow.db")
    (parent,) = [x for x in runs if "mlflow.parentRunId" not in x.data.tags]
    assert parent.info.status == "FAILED"
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before  # input untouched

    # (2) the whole DAG
    t0 = time.perf_counter()
    r = run_cli(["run", *base], cwd=tmp_path)
    first_s = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for stage in STAGES:
        assert re.search(rf"\[\d/7\] {stage}\s+success", out), out
    assert re.search(r"fill \d+\.\d+%", out) and "tok/s" in out and "MFU" in out and "perplexity" in out
    m = re.search(r"register   packtrain-lm v(\d+) → (champion|challenger)", out)
    assert m, out
    assert f"mlflow ui --backend-store-uri sqlite:///{wd / 'mlflow.db'}" in out
    client, runs = _runs(wd / "mlflow.db")
    parents = [x for x in runs if "mlflow.parentRunId" not in x.data.tags and x.info.status == "FINISHED"]
    assert len(parents) == 1
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(x.info.run_name for x in children) == sorted(STAGES)
    assert all(x.data.tags.get("kfp.run_id") for x in children)  # the KFP run id reached every stage
    assert parents[0].data.metrics["pack.fill"] > 0.5
    mv = client.get_model_version_by_alias("packtrain-lm", "champion")
    assert str(mv.version) == m.group(1)

    # (3) unchanged: every stage from the cache, a fraction of the first run's time, still tracked
    t0 = time.perf_counter()
    r = run_cli(["run", *base], cwd=tmp_path)
    second_s = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("(cached)") == 7, r.stdout
    assert second_s < first_s / 2, (first_s, second_s)
    client, runs = _runs(wd / "mlflow.db")
    last_parent = [x for x in runs if "mlflow.parentRunId" not in x.data.tags][-1]
    cached = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == last_parent.info.run_id]
    assert sorted(x.info.run_name for x in cached) == sorted(STAGES)
    assert {x.data.tags.get("packtrain.cache") for x in cached} == {"hit"}
    assert len(client.search_model_versions("name = 'packtrain-lm'")) == 1  # nothing re-registered
