"""`packtrain compare` against a real `mlflow server` (the session's `mlflow_server`, experiment "compare-mlflow")
on two pipeline runs that differ in one parameter (train.lr): the runs are named by 8-character prefixes, walked
to their train stage runs, and the report shows both runs' loss, tokens/s, MFU, utilization and memory curves,
the one differing param under its stage, and the gate verdict of `packtrain.gate.gate` on the same runs.
`--experiment` lists pipeline runs only (stage runs with --stage-runs).

The run trees are made by the functions `packtrain run` uses (start_pipeline_run opens the parent with the
whole config as params and exports PACKTRAIN_PARENT_RUN_ID; the real `packtrain train` CLI nests its stage
run under it), on synthetic token/pack stores: the other stages add nothing compare reads, and a whole
`packtrain run` costs ~60 s a run on the CI machine against ~2 s for this train stage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.tracking import end_pipeline_run, start_pipeline_run
from packtrain.tracking.run_lifecycle import _close_clients

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:telemetry threshold violated")]   # CPU utilization

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=2",
        "train.max_steps=12", "train.warmup_steps=2", "train.threads=1", "telemetry.interval_s=0.05",
        "tracking.system_metrics=false", "tracking.flush_interval_s=0", "tracking.experiment=compare-mlflow"]
EXP = "compare-mlflow"   # this module's experiment on the shared server: no other module's runs in it
LRS = ("3e-3", "1e-3")   # the one parameter the two pipeline runs differ in
CURVES = {"loss": "loss", "tokens/s": "real_tokens_per_s", "MFU": "useful_mfu",
          "utilization": "system/train_utilization_percentage", "memory": "system/train_memory_used_gib"}


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def pipelines(mlflow_server, tmp_path_factory):
    """Two pipeline runs (train.lr 3e-3 vs 1e-3) on the server: {"uri", "pipeline": [ids], "train": [ids]}."""
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("compare_pipelines")
    make_synthetic_inputs(root, n_docs=120, vocab_size=128, budget=64, seed=1)
    parents, trains = [], []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
        for i, lr in enumerate(LRS):
            sets = [*TINY, f"workdir={root / 'work'}", f"train.lr={lr}"]
            parent = start_pipeline_run(load_run_config("tiny-cpu", sets))
            try:
                assert main(["train", "--packs", str(root / "pack"), "--tokens", str(root / "tokenize"),
                             "--out", str(root / f"train{i}"), *_sets(*sets)]) == 0
            finally:
                end_pipeline_run(parent)
            parents.append(parent)
        _close_clients()
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(EXP).experiment_id
    for p in parents:
        kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{p}'")
        assert [k.info.run_name for k in kids] == ["train"]
        trains.append(kids[0].info.run_id)
    return {"uri": mlflow_server.uri, "pipeline": parents, "train": trains, "client": client}


def test_compare_pipeline_runs_curves_params_gate(pipelines, tmp_path, capsys):
    from packtrain.gate import evaluate_gate
    from packtrain.gate.metric_sources import load_source

    out = tmp_path / "cmp"
    refs = [p[:8] for p in pipelines["pipeline"]]                 # what `packtrain run` prints
    assert main(["compare", *refs, *_sets(f"tracking.tracking_uri={pipelines['uri']}"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    saved = json.loads((out / "compare.json").read_text())

    # each pipeline run is walked to its train stage run
    assert [r["run_id"] for r in saved["runs"]] == pipelines["pipeline"]
    assert [r["train_run_id"] for r in saved["runs"]] == pipelines["train"]
    assert [r["kind"] for r in saved["runs"]] == ["pipeline", "pipeline"]
    # only the differing param, under its stage
    assert saved["params_differ"] == {"train": {"train.lr": ["0.003", "0.001"]}}
    assert re.search(r"params that differ: 1 of \d+, by stage:\n  train\n    train\.lr\s+0\.003\s+0\.001", text)
    # curves of both runs in every group, from the train runs' histories
    for group, metric in CURVES.items():
        assert metric in saved["curves"][group], (group, saved["curves"])
        a, b = saved["histories"][metric]
        assert len(a) > 1 and len(b) > 1, metric
    assert [x for x, _ in saved["histories"]["loss"][0]] == list(range(1, 13))
    train0 = pipelines["client"].get_metric_history(pipelines["train"][0], "loss")
    assert [y for _, y in saved["histories"]["loss"][0]] == [m.value for m in sorted(train0, key=lambda m: m.step)]
    html = (out / "compare.html").read_text()
    assert len(re.findall(r"src='data:image/png;base64,", html)) == len(CURVES) and "src='http" not in html
    # the gate verdict is `packtrain gate --candidate 2nd --baseline 1st`'s own, on the same run trees
    expected = evaluate_gate(load_source(refs[1], pipelines["uri"]), load_source(refs[0], pipelines["uri"]))
    assert expected.rows and "train.throughput.real_tokens_per_s" in {r.metric for r in expected.rows}
    assert [g["verdict"] for g in saved["gates"]] == [expected.verdict]
    assert sorted(r["metric"] for r in saved["gates"][0]["rows"]) == sorted(r.metric for r in expected.rows)
    labels = [f"pipeline·{p[:8]}" for p in pipelines["pipeline"]]
    assert f"gate {expected.verdict}: {labels[1]} vs baseline {labels[0]}" in text
    assert re.search(r"real tokens/s, median \[train\.throughput\.real_tokens_per_s\]\s+[\d,]+(?:\.\d+)?\s+[\d,]+(?:\.\d+)?", text)
    assert saved["metrics"]["train.final_loss"] == [h[-1][1] for h in saved["histories"]["loss"]]

    # logged to a new "compare" run; the compared runs are untouched
    c = pipelines["client"]
    run = c.get_run(re.search(r"logged to MLflow run (\w+)", text).group(1))
    assert run.info.run_name == "compare" and run.data.tags["packtrain.compare.runs"] == ",".join(pipelines["pipeline"])
    assert {a.path for a in c.list_artifacts(run.info.run_id, "compare")} == \
        {"compare/compare.html", "compare/compare.json", "compare/compare.md"}
    assert all(not c.list_artifacts(rid) for rid in pipelines["pipeline"])


def test_compare_model_alias_is_its_pipeline(pipelines, tmp_path):
    """NAME@ALIAS names the version's source run (a stage run): compare lifts it to its pipeline run, so the
    columns diff whole configs (only train.lr), and still draws that pipeline's train curves."""
    c = pipelines["client"]
    c.create_registered_model("compare-lm")
    mv = c.create_model_version("compare-lm", f"runs:/{pipelines['train'][0]}/model", run_id=pipelines["train"][0])
    c.set_registered_model_alias("compare-lm", "champion", mv.version)
    argv = ["compare", "compare-lm@champion", pipelines["pipeline"][1][:8], "--no-log",
            *_sets(f"tracking.tracking_uri={pipelines['uri']}"), "--out", str(tmp_path)]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [r["ref"] for r in saved["runs"]] == ["compare-lm@champion", pipelines["pipeline"][1][:8]]
    assert [r["run_id"] for r in saved["runs"]] == pipelines["pipeline"]
    assert [r["train_run_id"] for r in saved["runs"]] == pipelines["train"]
    assert saved["params_differ"] == {"train": {"train.lr": ["0.003", "0.001"]}}


@pytest.mark.parametrize("extra,kind", [([], "pipeline"), (["--stage-runs"], "train")])
def test_compare_experiment_lists_pipeline_runs(pipelines, tmp_path, extra, kind):
    argv = ["compare", "--experiment", EXP, *extra, "--no-log",
            *_sets(f"tracking.tracking_uri={pipelines['uri']}"), "--out", str(tmp_path)]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [r["run_id"] for r in saved["runs"]] == pipelines[kind]     # oldest first; no compare run
    assert [r["train_run_id"] for r in saved["runs"]] == pipelines["train"]
    assert saved["params_differ"] == {"train": {"train.lr": ["0.003", "0.001"]}}


def test_compare_filter_on_pipeline_params(pipelines, tmp_path, capsys):
    argv = ["compare", "--experiment", EXP, "--filter", "params.`train.lr` = '0.001'", "--no-log",
            *_sets(f"tracking.tracking_uri={pipelines['uri']}"), "--out", str(tmp_path)]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [r["run_id"] for r in saved["runs"]] == pipelines["pipeline"][1:] and saved["gates"] == []
    assert "params that differ: 0 of" in capsys.readouterr().out


@pytest.mark.parametrize("extra,needle", [
    (["--experiment", "nope"], "no such experiment"),
    (["--experiment", EXP, "--filter", "this is not a filter"], "--filter"),
    (["--experiment", EXP, "--filter", "params.`train.lr` = '9'"], "no pipeline runs"),
    (["0123456789abcdef0123456789abcdef"], "not found"),
    (["fedcba98"], "no run id in the MLflow store starts with it"),
    (["abc"], "too short"),
    (["--stage-runs", "0123456789abcdef"], "--stage-runs needs --experiment"),
    ([], "give run ids or --experiment"),
])
def test_compare_bad_input(pipelines, tmp_path, capsys, extra, needle):
    argv = ["compare", *extra, "--no-log", *_sets(f"tracking.tracking_uri={pipelines['uri']}"), "--out",
            str(tmp_path)]
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "compare.html").exists()


def test_compare_missing_store_names_it(tmp_path, capsys):
    missing = tmp_path / "nowhere.db"
    assert main(["compare", "0123456789abcdef", "--no-log", *_sets(f"tracking.tracking_uri=sqlite:///{missing}"),
                 "--out", str(tmp_path)]) == 2
    assert str(missing) in capsys.readouterr().err and not Path(missing).exists()
