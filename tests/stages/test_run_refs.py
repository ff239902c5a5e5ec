"""Run references, the copy a cached stage run gets, the MLflow hint and the progress line — on a real sqlite
MLflow store (the same against a real `mlflow server`: tests/pipelines/test_run_server.py)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from packtrain.pipeline.progress import Progress, format_bar, parse_bar
from packtrain.tracking.buffer import BufferedClient
from packtrain.tracking.links import mlflow_hint
from packtrain.tracking.refs import RunRefError, resolve_run_ref, stage_run_of
from packtrain.tracking.restore import restore_run


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store: a pipeline run with train/evaluate children, a lone run, a registered version."""
    root = tmp_path_factory.mktemp("refs")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("refs", artifact_location=(root / "artifacts").as_uri())
    parent = c.create_run(exp, run_name="pipeline", tags={"packtrain.kind": "pipeline"}).info.run_id
    kids = {s: c.create_run(exp, run_name=s, tags={"packtrain.kind": "stage", "mlflow.parentRunId": parent}
                            ).info.run_id for s in ("train", "evaluate")}
    lone = c.create_run(c.create_experiment("other"), run_name="ingest").info.run_id
    c.create_registered_model("lm")
    mv = c.create_model_version("lm", f"runs:/{kids['evaluate']}/model", run_id=kids["evaluate"])
    c.set_registered_model_alias("lm", "champion", mv.version)
    return {"root": root, "uri": uri, "client": c, "parent": parent, "lone": lone, "exp": exp, **kids}


def test_full_id_prefix_alias_version_and_stage_of(store):
    c, train = store["client"], store["train"]
    assert resolve_run_ref(c, train) == train
    assert resolve_run_ref(c, train[:6]) == train                      # the shortest accepted prefix
    assert resolve_run_ref(c, train[:8].upper()) == train              # as printed, any case
    assert resolve_run_ref(c, f"runs:/{train[:10]}/model") == train
    assert resolve_run_ref(c, store["lone"][:8]) == store["lone"]      # any experiment
    for ref in ("lm@champion", "models:/lm@champion", "models:/lm/1"):
        assert resolve_run_ref(c, ref) == store["evaluate"]
    # the train run of a pipeline tree, from the parent, a sibling or itself; a lone run has none
    assert stage_run_of(c, store["parent"], "train") == train
    assert stage_run_of(c, resolve_run_ref(c, "lm@champion"), "train") == train
    assert stage_run_of(c, train, "train") == train
    assert stage_run_of(c, store["lone"], "train") is None


@pytest.mark.parametrize("ref, needle", [
    ("abc", "too short: give at least 6"),
    ("0" * 32, "not found in store sqlite:///"),
    ("ffffff0", "no run id in the MLflow store starts with it"),
    ("not-a-run!", "not a run id (32 hex characters)"),
    ("lm@nope", "alias 'nope' of model 'lm' not found"),
    ("models:/lm/9", "version 9 of model 'lm' not found"),
])
def test_bad_refs_exit_2_naming_what_is_wrong(store, ref, needle):
    with pytest.raises(RunRefError) as e:
        resolve_run_ref(store["client"], ref)
    assert e.value.exit_code == 2 and needle in str(e.value), str(e.value)


def test_ambiguous_prefix_lists_every_candidate(store):
    c = store["client"]
    ids = [store[k] for k in ("parent", "train", "evaluate", "lone")]
    # 4 ids may or may not share a first hex digit; 17 always do (pigeonhole over 16 digits)
    first = {i[0] for i in ids}
    shared = next((ch for ch in first if sum(i[0] == ch for i in ids) > 1), None)
    if shared is None:
        exp = store["exp"]
        extra = [c.create_run(exp, run_name=f"x{i}").info.run_id for i in range(13)]
        ids += extra
        shared = next(ch for ch in {i[0] for i in ids} if sum(i[0] == ch for i in ids) > 1)
    with pytest.raises(RunRefError) as e:
        resolve_run_ref(c, shared, min_prefix=1)
    msg = str(e.value)
    assert f"run prefix {shared!r} is ambiguous" in msg and "Give more characters" in msg
    assert all(i in msg for i in ids if i.startswith(shared)), msg


def test_restore_copies_histories_params_tags_datasets_artifacts(store, tmp_path):
    """A cached stage's new run (in another store, as after switching to a server) becomes a full copy."""
    c, origin = store["client"], store["train"]
    for step, loss in enumerate([5.0, 4.5, 4.25]):
        c.log_metric(origin, "loss", loss, step=step)
    c.log_param(origin, "train.lr", "0.003")
    c.set_tag(origin, "packtrain.violation.util", "low")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "loss.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "train_result.json").write_text('{"steps": 3}')
    c.log_artifacts(origin, str(tmp_path / "plots"), "plots")
    c.log_artifact(origin, str(tmp_path / "train_result.json"))
    bc = BufferedClient(f"sqlite:///{tmp_path / 'new.db'}", tmp_path / "buffer")
    new = bc.create_run("copies", "train", {"packtrain.kind": "stage", "packtrain.cache": "hit"})
    res = restore_run(bc, new, {"run_id": origin, "tracking_uri": store["uri"]})
    assert res["copied"] and res["points"] == 3 and res["artifacts"] == 2, res
    dst = MlflowClient(f"sqlite:///{tmp_path / 'new.db'}")
    run = dst.get_run(new)
    assert [(m.step, m.value) for m in dst.get_metric_history(new, "loss")] == [(0, 5.0), (1, 4.5), (2, 4.25)]
    assert run.data.params == {"train.lr": "0.003"}
    tags = run.data.tags
    assert tags["packtrain.restored_from"] == origin and tags["packtrain.restored_from_uri"] == store["uri"]
    assert tags["packtrain.violation.util"] == "low" and tags["packtrain.cache"] == "hit"
    assert tags["packtrain.kind"] == "stage" and "mlflow.parentRunId" not in tags   # its own, not the origin's
    assert sorted(f.path for f in dst.list_artifacts(new)) == ["plots", "train_result.json"]
    assert [f.path for f in dst.list_artifacts(new, "plots")] == ["plots/loss.png"]
    # an origin that cannot be read never fails the pipeline: the run says why
    gone = bc.create_run("copies", "train", {})
    res = restore_run(bc, gone, {"run_id": "0" * 32, "tracking_uri": f"sqlite:///{tmp_path / 'missing.db'}"})
    assert not res["copied"] and "no longer exists" in res["reason"]
    assert dst.get_run(gone).data.tags["packtrain.restored_copy"].startswith("failed: FileNotFoundError")
    bc.close()


def test_restore_never_opens_a_sqlite_file_that_is_not_an_mlflow_store(store, tmp_path):
    """The origin's URI is read from a cache entry: one naming a user's own sqlite file (not an MLflow store)
    is not opened by MLflow (which would create its tables in it); the file stays byte-identical."""
    import sqlite3

    app = tmp_path / "app.db"
    con = sqlite3.connect(app)
    con.execute("CREATE TABLE users (name TEXT)")
    con.execute("INSERT INTO users VALUES ('alice')")
    con.commit()
    con.close()
    before = app.read_bytes()
    bc = BufferedClient(store["uri"], tmp_path / "buffer")
    new = bc.create_run("copies", "train", {})
    res = restore_run(bc, new, {"run_id": "0" * 32, "tracking_uri": f"sqlite:///{app}"})
    bc.close()
    assert not res["copied"] and "is not an MLflow database" in res["reason"], res
    assert app.read_bytes() == before


def test_mlflow_hint_per_store_kind():
    rid = "3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f"
    assert mlflow_hint("http://alice:s3cret@127.0.0.1:5000/", "1", rid) == \
        f"open http://127.0.0.1:5000/#/experiments/1/runs/{rid}?workflowType=machine_learning"
    hint = mlflow_hint("sqlite:////abs/data/mlflow.db", "1", rid)
    assert "mlflow ui --backend-store-uri sqlite:////abs/data/mlflow.db, then open " \
           f"http://127.0.0.1:5000/#/experiments/1/runs/{rid}?workflowType=machine_learning" in hint
    pg = mlflow_hint("postgresql://u:s3cret@db/mlflow", "2", rid)
    assert "postgresql://u:***@db/mlflow (put the password back)" in pg and "s3cret" not in pg
    assert mlflow_hint("databricks", "2", rid) == f"open experiment 2, run {rid} in your Databricks workspace"


def test_progress_line_from_the_train_bar():
    bar = parse_bar("    train:  33%|███▎      | 2/6 [01:02:03<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]")
    assert format_bar(bar, "train") == "step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 1:02:03 elapsed · ETA 0:24"
    every = Progress(0)
    assert every.line("    Loading weights:  50%|█████     | 10/20 [00:00<00:00, 99.0it/s]", "train") is None
    assert every.line("    train: 100%|██████████| 6/6 [00:01<00:00,  3.70step/s, loss=4.98]", "train") is None
    assert every.line("    train:  50%|█████     | 3/6 [00:01<00:01,  1.90step/s]", "train").startswith("step 3/6")
    assert Progress(3600).line("    train:  50%|█████     | 3/6 [00:01<00:01,  1.90step/s]", "train") is None
