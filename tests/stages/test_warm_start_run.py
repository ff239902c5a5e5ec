"""Scheduled retraining through the real `packtrain run` CLI (its entry point in this process), twice on the same data with model.init_from=champion
(what recipes/retrain-cpu.yaml and the Airflow DAG do):

1. no champion yet → the run falls back to model.init_fallback=scratch and says so (train run tags, the
   registered version's tags); v1 becomes champion;
2. the run warm-starts from models:/packtrain-lm/1: it tokenizes with v1's own tokenizer (same ids as run 1),
   its step-0 held-out loss equals v1's recorded eval loss (CPU, fp32: within 1e-4), and v2 records its parent
   version in the Model Registry. The stage cache reuses ingest/validate but not tokenize/train (the init
   source changed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from pipeline_helpers import as_args, run_main, tiny_corpus, tiny_settings  # noqa: E402

pytestmark = pytest.mark.slow


def _train_runs(client):
    exp = client.get_experiment_by_name("packtrain")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"], max_results=500)
    return [r for r in runs if r.info.run_name in ("train", "tokenize")]


def test_second_run_starts_where_the_champion_ended(tmp_path, seed_mlflow_store):
    import mlflow

    corpus = tiny_corpus(tmp_path / "corpus")
    wd = tmp_path / "wd"
    seed_mlflow_store(wd / "mlflow.db")   # the workdir's store, empty (its creation: not the subject)
    args = as_args(tiny_settings(wd, corpus)) + ["--set", "model.init_from=champion"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}",
                                 registry_uri=f"sqlite:///{wd / 'mlflow.db'}")

    first = run_main(["run", *args], cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "register   packtrain-lm v1 → champion" in first.stdout, first.stdout
    (train1,) = [r for r in _train_runs(client) if r.info.run_name == "train"]
    t = train1.data.tags
    assert (t["packtrain.init_from"], t["packtrain.init_resolved"]) == ("champion", "scratch")
    assert t["packtrain.init_fallback_reason"].startswith("no champion yet: no registered model 'packtrain-lm'")
    finals1 = client.get_run(train1.data.tags["mlflow.parentRunId"]).data.metrics   # the pipeline run's train.*
    assert "train.init_eval_loss" not in finals1 and "train.final_loss" in finals1   # nothing to measure from random weights
    v1 = client.get_model_version("packtrain-lm", "1")
    assert v1.tags["packtrain.init_fallback_reason"] == t["packtrain.init_fallback_reason"]
    assert "packtrain.parent_model_version" not in v1.tags

    second = run_main(["run", *args], cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "(2 from cache: ingest, validate)" in second.stdout, second.stdout   # tokenize/train: new init source
    runs = _train_runs(client)
    tok1, tok2 = [r for r in runs if r.info.run_name == "tokenize"]
    train2 = [r for r in runs if r.info.run_name == "train"][-1]
    # the champion's tokenizer travelled with it: same tokenizer (hash) and the same ids as run 1's trained BPE
    assert tok2.data.tags["packtrain.tokenizer_from"] == "champion"
    assert tok2.data.tags["packtrain.tokenizer_hash"] == tok1.data.tags["packtrain.tokenizer_hash"]
    assert tok2.data.tags["dvc.md5.tokens"] == tok1.data.tags["dvc.md5.tokens"]
    # step 0 of run 2 is where v1 ended: its recorded eval loss
    t2 = train2.data.tags
    assert (t2["packtrain.init_from"], t2["packtrain.init_resolved"], t2["packtrain.parent_model_version"]) == (
        "champion", "models:/packtrain-lm/1", "1")
    assert "packtrain.init_fallback_reason" not in t2
    champion_loss = float(v1.tags["eval_loss"])
    init_loss = client.get_run(train2.data.tags["mlflow.parentRunId"]).data.metrics["train.init_eval_loss"]
    assert abs(init_loss - champion_loss) <= 1e-4, (init_loss, champion_loss)
    # the new version records its parent in the registry
    v2 = client.get_model_version("packtrain-lm", "2")
    assert (v2.tags["packtrain.parent_model_version"], v2.tags["packtrain.parent_model"],
            v2.tags["packtrain.init_from"]) == ("1", "models:/packtrain-lm/1", "champion")
    assert (wd / "models" / "packtrain-lm" / "v1" / "packtrain_source.json").is_file()
