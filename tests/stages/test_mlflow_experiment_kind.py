"""The MLflow 3 UI opens packtrain's experiment in its training view.

The experiment carries mlflow.experimentKind = custom_model_development (set on creation, added to one that lacks
it, a user's own kind kept): older MLflow 3 UIs choose the view by it. MLflow 3.17's UI does not read that tag for
the view: it follows its sidebar switch "GenAI | Model training" (the URL's `workflowType`, else the browser's
remembered choice, GenAI in a fresh profile), so a check of the tag alone passed while a fresh browser opened the
GenAI "Overview". The links packtrain prints carry `?workflowType=machine_learning`; the second test opens them in
headless Chromium on a real `mlflow server` and reads what the page shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import ARTIFACTS, CHROMIUM, SKIP_REASON, Browser, colours, keep
from mlflow import MlflowClient

from packtrain.config import load_run_config
from packtrain.tracking import stage_run
from packtrain.tracking.store_ops import EXPERIMENT_KIND, TRAINING_KIND


def test_packtrains_experiments_open_in_the_training_view(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path}", f"tracking.tracking_uri={uri}",
                                       "tracking.system_metrics=false", "tracking.experiment=fresh"])
    with stage_run("ingest", cfg) as run:
        run.log_metrics({"documents": 1.0})
    c = MlflowClient(uri)
    assert c.get_experiment_by_name("fresh").tags[EXPERIMENT_KIND] == TRAINING_KIND
    old = c.create_experiment("older")                       # made before packtrain set the kind
    mine = c.create_experiment("mine", tags={EXPERIMENT_KIND: "genai_development"})   # the user's choice
    for name in ("older", "mine"):
        with stage_run("ingest", cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"experiment": name})})):
            pass
    assert c.get_experiment(old).tags[EXPERIMENT_KIND] == TRAINING_KIND
    assert c.get_experiment(mine).tags[EXPERIMENT_KIND] == "genai_development"


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=SKIP_REASON)
def test_the_printed_links_open_the_training_view_in_a_fresh_browser(mlflow_server, tmp_path, capsys):
    """`packtrain run`'s "MLflow open …" link (and the experiment's) in a fresh Chromium profile: the Runs table
    and the run page under "Runs", the training sidebar (Runs, Models, Model registry), no GenAI Overview."""
    pytest.importorskip("websocket", reason="websocket-client (installed with kfp's kubernetes client) drives Chromium")
    from packtrain.tracking.links import mlflow_hint, run_path

    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path}", f"tracking.tracking_uri={mlflow_server.uri}",
                                       "tracking.system_metrics=false", "tracking.experiment=ui-training-view"])
    with stage_run("ingest", cfg) as run:
        run.log_metrics({"documents": 3.0})
        run_id = run.run_id
    exp = MlflowClient(mlflow_server.uri).get_run(run_id).info.experiment_id
    hint = mlflow_hint(mlflow_server.uri, exp, run_id)   # what `packtrain run` prints
    assert hint.startswith("open "), hint
    pages = {"experiment": mlflow_server.uri + run_path(exp, None), "run": hint.removeprefix("open ")}
    browser, seen, shots = Browser(tmp_path / "profile"), {}, {}
    try:
        browser.call("Page.enable")
        for name, url in pages.items():
            browser.call("Page.navigate", url=url)
            needles = ["ingest", "matching run"] if name == "experiment" else ["ingest", "Model metrics", "Run ID"]
            text = browser.wait_text(needles)
            seen[name] = {"text": text, "url": browser.evaluate("location.href"), "dom": browser.evaluate("""({
                nav: [...document.querySelectorAll('nav')].map(n => n.innerText).join('\\n'),
                crumbs: [...document.querySelectorAll('.du-bois-light-breadcrumb')].map(n => n.innerText).join('\\n'),
            })""")}
            shots[name] = browser.screenshot(1600)
    finally:
        browser.close()
    kept = [keep(png, tmp_path, f"mlflow-training-view-{name}.png") for name, png in shots.items()]
    with capsys.disabled():
        print("\nMLflow UI screenshots: " + ", ".join(str(ARTIFACTS / k.name) for k in kept) + f" (and {tmp_path})")

    for name, page in seen.items():
        nav = page["dom"]["nav"].split("\n")
        assert {"Runs", "Models", "Model registry"} <= set(nav), (name, nav)   # the training sidebar
        assert not {"Observability", "Sessions", "Judges"} & set(nav), (name, nav)   # not the GenAI one
        assert "Detect Issues" not in page["text"] and "Token Usage" not in page["text"], (name, page["text"][:2000])
        assert "workflowType=machine_learning" in page["url"], page["url"]
    exp_page = seen["experiment"]
    assert f"/experiments/{exp}/runs?" in exp_page["url"], exp_page["url"]   # the Runs table, not /overview
    assert "Run Name" in exp_page["text"] and "1 matching run" in exp_page["text"], exp_page["text"][:2000]
    run_page = seen["run"]
    assert run_page["dom"]["crumbs"].split("\n")[:2] == ["ui-training-view", "Runs"], run_page["dom"]   # not "Evaluations"
    assert run_id in run_page["text"] and "documents" in run_page["text"], run_page["text"][:2000]
    for png in shots.values():
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and colours(png) > 50
