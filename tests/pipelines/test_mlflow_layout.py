"""The MLflow layout of a pipeline run (docs/tracking.md, "The MLflow layout"), read back from the session's real
tiny pipeline run (`tiny_pipeline`: every stage ran, in its own sqlite store): first with MlflowClient, then in the
MLflow UI of a real `mlflow server` opened in headless Chromium (tests/chromium.py), with the screenshots kept under
the test's tmp dir (and copied to $PACKTRAIN_TEST_ARTIFACTS, the path printed).

    tiny-cpu · data <8 hex>    the pipeline run, named by recipe and data version; every final number once
    └── train                  3 charts at real steps (loss, real_tokens_per_s, useful_mfu), system/ series at
                               their sample time, dataset train_packs (training), the logged model and
                               "Registered models: packtrain-lm v1" (the version's run is this run)
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from chromium import ARTIFACTS, CHROMIUM, SKIP_REASON, Browser, colours, keep
from mlflow import MlflowClient

from packtrain.tracking.layout import STEP_CHARTS, pipeline_run_name

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tree(tiny_pipeline):
    """The first pipeline run of the session's tiny pipeline: its runs by name, its stats, the store."""
    assert tiny_pipeline["result"].returncode == 0, tiny_pipeline["result"].stdout[-3000:]
    rec = json.loads(tiny_pipeline["json"].read_text())
    db = tiny_pipeline["workdir"] / "mlflow.db"
    c = MlflowClient(f"sqlite:///{db}")
    parent = c.get_run(rec["parent_run_id"])
    kids = c.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return {"client": c, "db": db, "parent": parent, "runs": {r.info.run_name: r for r in kids},
            "stages": rec["stages"]}


def test_the_pipeline_run_is_named_by_recipe_and_data_version(tree):
    data_version = tree["stages"]["ingest"]["lineage"]["data_version"]   # the DVC md5 of the ingest source
    assert tree["parent"].info.run_name == pipeline_run_name("tiny-cpu", data_version) == \
        f"tiny-cpu · data {data_version[:8]}"
    assert tree["parent"].data.tags["mlflow.runName"] == tree["parent"].info.run_name


def test_the_train_run_charts_only_real_step_series_and_each_final_number_lives_once(tree, tmp_path):
    c, train, parent = tree["client"], tree["runs"]["train"], tree["parent"]
    steps = tree["stages"]["train"]["steps"]
    model = {k for k in train.data.metrics if not k.startswith("system/")}
    assert model == set(STEP_CHARTS) == {"loss", "real_tokens_per_s", "useful_mfu"}   # tiny: no eval_loss
    for k in model:   # one point per optimizer step, at that step: no single values, no millisecond steps
        assert sorted(m.step for m in c.get_metric_history(train.info.run_id, k)) == list(range(1, steps + 1)), k
    util = c.get_metric_history(train.info.run_id, "system/train_utilization_percentage")   # the sampler's
    assert util and all(train.info.start_time - 1000 <= m.timestamp <= train.info.end_time for m in util)
    # the final numbers: once, on the pipeline run under the gate's names; the train run's summary.json
    summary = json.loads(Path(c.download_artifacts(train.info.run_id, "summary.json", str(tmp_path))).read_text())
    finals = parent.data.metrics
    assert summary["throughput.real_tokens_per_s"] == finals["train.throughput.real_tokens_per_s"] == \
        tree["stages"]["train"]["throughput"]["real_tokens_per_s"]
    assert {f"train.{k}" for k in summary} <= set(finals)
    for k in ("train.throughput.real_tokens_per_s", "train.final_loss", "train.system.utilization"):
        assert len(c.get_metric_history(parent.info.run_id, k)) == 1, k   # logged by the stage, not again
    assert not [k for k in finals if k.startswith("train.summary.")]


def test_the_train_run_owns_its_datasets_and_the_registered_model(tree):
    c, train, register = tree["client"], tree["runs"]["train"], tree["runs"]["register"]
    (ds,) = train.inputs.dataset_inputs
    lineage = tree["stages"]["train"]["lineage"]
    assert (ds.dataset.name, ds.dataset.digest) == ("train_packs", lineage["input_md5"]["packs"])
    assert [t.value for t in ds.tags if t.key == "mlflow.data.context"] == ["training"]
    (out,) = train.outputs.model_outputs
    assert out.step == tree["stages"]["train"]["steps"]   # the weights after the last step
    logged = c.get_logged_model(out.model_id)
    assert logged.source_run_id == train.info.run_id
    mv = c.get_model_version("packtrain-lm", tree["stages"]["register"]["version"])
    assert mv.run_id == train.info.run_id and mv.source == f"models:/{out.model_id}"
    assert mv.tags["packtrain.train_run_id"] == train.info.run_id
    assert mv.tags["packtrain.register_run_id"] == register.info.run_id   # the decision's artifacts
    assert not (register.outputs and register.outputs.model_outputs)
    assert register.data.tags["packtrain.decision"] == tree["stages"]["register"]["decision"]   # it still decides


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=SKIP_REASON)
def test_the_train_run_in_the_mlflow_ui(tree, tmp_path, capsys):
    """The train run's page in a real `mlflow server` (its UI, in Chromium): parent run named by recipe and data
    version, the dataset with its context, the registered model linked to its version, 3 model-metric charts."""
    pytest.importorskip("websocket", reason="websocket-client (installed with kfp's kubernetes client) drives Chromium")
    from mlflow_server import Server, free_port

    db = tmp_path / "mlflow.db"   # a consistent copy: later tests run pipelines into the shared store
    with sqlite3.connect(tree["db"]) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    server = Server(tmp_path, free_port(), db=db)
    server.start()
    train, parent = tree["runs"]["train"], tree["parent"]
    page = f"{server.uri}/#/experiments/{train.info.experiment_id}/runs/{train.info.run_id}"
    browser = Browser(tmp_path / "profile")
    shots = {}
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=page)
        overview = browser.wait_text(["Registered models", "packtrain-lm", "train_packs", parent.info.run_name])
        dom = browser.evaluate("""((parentName) => {
            const section = name => [...document.querySelectorAll('h4, h3, h2')].find(h => h.innerText.trim() === name);
            const regs = section('Registered models');
            return {links: [...regs.parentElement.querySelectorAll('a')].map(a => [a.innerText.trim(), a.getAttribute('href')]),
                    parent: [...document.querySelectorAll('a')].filter(a => a.innerText.trim() === parentName).length};
        })(""" + json.dumps(parent.info.run_name) + ")")
        shots["overview"] = browser.screenshot()
        browser.call("Page.navigate", url=f"{page}/model-metrics")
        charts = browser.wait_text(["Model metrics", "Step", *(f"train ({k})" for k in STEP_CHARTS)])
        n_charts = browser.evaluate("[...document.body.innerText.matchAll(/^train \\((.+)\\)$/gm)].length")
        shots["model-metrics"] = browser.screenshot()
        browser.call("Page.navigate", url=f"{page}/system-metrics")
        system = browser.wait_text(["System metrics", "train_utilization_percentage", "train_memory_used_gib"])
        shots["system-metrics"] = browser.screenshot()
    finally:
        browser.close()
        server.stop()
    kept = [keep(png, tmp_path, f"mlflow-train-{name}.png") for name, png in shots.items()]
    with capsys.disabled():   # in the test output even without -s
        print("\nMLflow UI screenshots: " + ", ".join(str(ARTIFACTS / k.name) for k in kept) + f" (and {tmp_path})")

    assert dom["parent"] >= 1, overview[:3000]                               # "Parent run: tiny-cpu · data …"
    assert [t for t, h in dom["links"] if h == "#/models/packtrain-lm/versions/1" and "packtrain-lm" in t], dom
    assert "packtrain-lm\nv1" in overview or "packtrain-lm v1" in overview, overview[:3000]   # "Registered models"
    assert "train_packs (" in overview and "Training" in overview          # the dataset and its context
    assert "Model metrics\n(3)" in charts or "Model metrics (3)" in charts, charts[:2000]
    assert n_charts == len(STEP_CHARTS) == 3                                # one chart each, nothing else
    assert "train (loss)" in charts and "Step" in charts
    # the sampler's series in the System metrics tab (tracking.system_metrics is off here: no MLflow monitor)
    assert "System metrics\n(2)" in system or "System metrics (2)" in system, system[:2000]
    for png in shots.values():
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and colours(png) > 50        # a rendered page, not one colour
