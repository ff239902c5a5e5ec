"""`run_stage_component` as it runs in a cluster pod: config from one JSON string, the KFP run id on the
MLflow runs, the parent run opened by the first stage and found by the next (separate pods: no env), and the
train component on train.gpus=2 launching its own ranks (rank 0's error and exit code reach the component).
The successful 2-rank train component runs in tests/pipelines/test_wheel_ir.py, from the installed wheel."""

from __future__ import annotations

import json
import os

import pytest
from pipeline_helpers import tiny_corpus, tiny_settings

from packtrain.config import load_run_config
from packtrain.errors import ConfigError, TrainingDiverged, ValidationFailed
from packtrain.pipeline.runtime import ERROR_ENV, config_from_text, run_stage_component
from packtrain.tracking.context import PARENT_ENV


def test_config_text_roundtrip_and_empty():
    cfg = load_run_config("tiny-cpu", ["pack.budget=128"])
    assert config_from_text(json.dumps(cfg.to_dict())) == cfg
    with pytest.raises(ConfigError, match="pipeline parameter 'config' is empty"):
        config_from_text(" ")
    with pytest.raises(ConfigError, match="pack.budget"):
        config_from_text(json.dumps({**cfg.to_dict(), "pack": {"budget": "big"}}))


def test_pods_share_one_parent_run_by_kfp_run_id(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)   # a new experiment's artifacts go under ./mlruns (MLflow's default), not the checkout

    corpus = tiny_corpus(tmp_path / "corpus", n_docs=20)
    cfg = load_run_config("tiny-cpu", tiny_settings(tmp_path / "wd", corpus) + ["tracking.system_metrics=false"])
    text = json.dumps(cfg.to_dict())
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(ERROR_ENV, str(tmp_path / "err.json"))
    # the component exports these into os.environ: register them so they are removed after the test
    monkeypatch.setenv(PARENT_ENV, "")
    monkeypatch.setenv("KFP_RUN_ID", "")

    docs = tmp_path / "art" / "documents"
    s1 = run_stage_component("ingest", text, {}, str(docs), kfp_run_id="kfp-123", code_version="0.1.0+gabc",
                             data_version="d41d.dir")
    assert s1["code_version"] == "0.1.0+gabc" and s1["data_version"] == "d41d.dir"
    first_parent = os.environ[PARENT_ENV]
    os.environ[PARENT_ENV] = os.environ["KFP_RUN_ID"] = ""  # the next stage runs in another pod
    run_stage_component("validate", text, {"documents": str(docs)}, str(tmp_path / "art" / "report"),
                        kfp_run_id="kfp-123")
    assert os.environ[PARENT_ENV] == first_parent
    os.environ[PARENT_ENV] = ""

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("packtrain.pipeline_run") == "kfp-123"]
    stages = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(stages) == {"ingest", "validate"}
    assert {r.data.tags.get("kfp.run_id") for r in stages.values()} == {"kfp-123"}
    # the first component opened the parent under the recipe's name; the ingest it ran named it by data version
    assert parent.info.run_name == f"tiny-cpu · data {s1['lineage']['data_version'][:8]}"

    # a failing stage records its error for `packtrain run` and re-raises
    bad = json.dumps(load_run_config("tiny-cpu", tiny_settings(tmp_path / "wd", corpus)
                                     + ["validate.min_rows=10000"]).to_dict())
    with pytest.raises(ValidationFailed):
        run_stage_component("validate", bad, {"documents": str(docs)}, str(tmp_path / "art" / "report2"))
    err = json.loads((tmp_path / "err.json").read_text())
    assert err["stage"] == "validate" and err["exit_code"] == 4 and "report" in err["message"].lower()


@pytest.mark.slow
def test_two_rank_train_component_raises_rank0_error_with_its_exit_code(tmp_path, monkeypatch):
    """The KFP train component's body with train.gpus=2: the stage launches two gloo ranks through torchrun
    (packtrain.train.launch); both diverge at step 2 (fault hook), and rank 0's TrainingDiverged — not torchrun's
    generic failure — reaches the component with exit code 8, recorded for `packtrain run`."""
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    tokens, packs = make_synthetic_inputs(tmp_path / "in", n_docs=120, vocab_size=128, budget=128, seed=1)
    cfg = load_run_config("tiny-cpu", [
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.gpus=2", "train.rows=2",
        "train.max_steps=3", "train.warmup_steps=1", "train.threads=1", "telemetry.interval_s=5",
        "telemetry.peak_tflops=1",   # no matmul probes in the ranks (MFU is not checked here)
        f"workdir={tmp_path / 'wd'}", "tracking.enabled=false"])
    monkeypatch.setenv(ERROR_ENV, str(tmp_path / "err.json"))
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.nan_loss@2")
    out = tmp_path / "art" / "model"
    with pytest.raises(TrainingDiverged, match="training diverged at step 2") as e:
        run_stage_component("train", json.dumps(cfg.to_dict()), {"packs": str(packs), "tokens": str(tokens)},
                            str(out))
    assert e.value.exit_code == 8
    err = json.loads((tmp_path / "err.json").read_text())
    assert err["stage"] == "train" and err["exit_code"] == 8 and err["type"] == "TrainingDiverged"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1]          # rank 0 trained step 1 with its peer, then stopped
    assert not (out / "model").exists()
