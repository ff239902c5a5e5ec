"""A Gemma2 checkpoint (attention soft-cap: refused on sdpa) through train → evaluate → register with every
attention setting left at `auto`: each stage picks a backend the family allows (eager on the CPU), the step-0
evaluation of the warm start included, and the trained model registers (real sqlite MLflow) without refusal."""

from __future__ import annotations

import json

import pytest

from packtrain.cli import main
from packtrain.testing.tiny_families import build_tiny_family_dir

V = 97


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("family_attention_data")
    make_synthetic_inputs(root, n_docs=40, vocab_size=V, budget=64, seed=4)
    return root


def test_gemma2_trains_and_evaluates_with_auto_attention(data, tmp_path):
    src = build_tiny_family_dir(tmp_path / "gemma2", "gemma2", V, seed=1)
    sets = ["train.rows=2", "train.max_steps=2", "train.warmup_steps=1", "train.threads=1", "tracking.enabled=false",
            "telemetry.interval_s=5", "model.tokenizer_check=vocab", "evaluate.rows=2", "evaluate.max_batches=1",
            "evaluate.sample_tokens=2", f"workdir={tmp_path / 'work'}", f"model.init_from={src}"]
    flags = [x for s in sets for x in ("--set", s)]
    out = tmp_path / "train"
    assert main(["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
                 *flags]) == 0
    result = json.loads((out / "train_result.json").read_text())
    assert result["setup"]["attention"] == "eager"
    assert result["init"]["eval"]["attention"] == "eager"           # the step-0 loss of the warm start
    assert main(["evaluate", "--model", str(out / "model"), "--packs", str(data / "pack"), "--out",
                 str(tmp_path / "ev"), *flags]) == 0
    assert json.loads((tmp_path / "ev" / "evaluate_result.json").read_text())["attention"] == "eager"


def test_gemma2_model_registers(tmp_path, monkeypatch):
    import mlflow
    from registry_helpers import register_model_dir as register_model

    from packtrain.config.evaluate import RegisterConfig
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    monkeypatch.chdir(tmp_path)   # MLflow puts artifacts of a new experiment under ./mlruns
    model = build_tiny_family_dir(tmp_path / "gemma2", "gemma2", V)
    before = mlflow.get_tracking_uri()
    set_fluent_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        r = register_model(model, {"eval_loss": 4.0}, None,
                           RegisterConfig(model_name="gemma2-lm", pip_requirements=["torch", "transformers"]))
    finally:
        set_fluent_tracking_uri(before)
    assert (r.version, r.decision) == ("1", "champion")
