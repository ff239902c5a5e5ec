"""Export round trip for every family: a model packtrain built from a checkpoint (model.init_from=<dir>), saved
by the train stage's own save path (TrainSession.save_model), loads back in plain transformers
(AutoModelForCausalLM.from_pretrained, its default attention) and through MLflow's transformers flavor (real
sqlite store in tmp) with identical logits.

Gemma2 is exported without its final logit soft-cap: with it, training is refused (the packed loss cannot apply
it yet, see packtrain.model.families), so there is no trained Gemma2 to export.
"""

from __future__ import annotations

import pytest
import torch

from packtrain.config import ModelConfig, PackConfig, TelemetryConfig, TrainConfig
from packtrain.testing.tiny_families import FAMILY_NAMES, build_tiny_family_dir

V = 97
BACKEND = {"gemma2": "eager"}   # transformers refuses sdpa for Gemma2 (and packtrain refuses it: soft-cap)
IDS = torch.tensor([[5, 17, 33, 8, 41, 60, 12, 9, 77, 23, 4, 51]])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("family_export_data")
    make_synthetic_inputs(root, n_docs=60, vocab_size=V, budget=64, seed=3)
    return root


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One sqlite store for the module (its schema migration takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('family_export_mlflow') / 'mlflow.db'}"


def _logits(model) -> torch.Tensor:
    """One thread, as the session trains (threads=1): a CPU matmul is bit-reproducible for a fixed thread count
    (MKL_CBWR), not across thread counts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return model(input_ids=IDS, use_cache=False).logits[0]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_export_round_trip(data, mlflow_uri, tmp_path, family, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a fresh sqlite store puts its artifacts under ./mlruns: here, not the checkout
    import mlflow
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packtrain.registry.model import default_pip_requirements, load_registered, log_model
    from packtrain.train.session import TrainSession

    extra = {"final_logit_softcapping": None} if family == "gemma2" else {}
    src = build_tiny_family_dir(tmp_path / "src", family, V, seed=7, **extra)
    backend = BACKEND.get(family, "sdpa")
    session = TrainSession(ModelConfig(init_from=str(src)),
                           TrainConfig(device="cpu", attention=backend, max_steps=1, threads=1), PackConfig(budget=64),
                           TelemetryConfig(interval_s=5), data / "pack", data / "tokenize" / "tokenizer",
                           tmp_path / "train")
    try:
        assert type(session.model).__name__.lower().startswith(family.split("_")[0])   # Gemma3ForCausalLM …
        built = _logits(session.model.eval())
        out = session.save_model()
    finally:
        session.close()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()   # no packtrain registry needed
    assert type(plain).__name__ == type(session.model).__name__
    assert plain.config.model_type == family
    assert torch.equal(_logits(plain), built), f"{family}: {(_logits(plain) - built).abs().max().item():.3g}"

    mlflow.set_tracking_uri(mlflow_uri)
    try:
        # an explicit experiment of this store: an earlier test in the same process may leave MLflow's active
        # experiment pointing into another store (seen under pytest-xdist)
        exp = mlflow.set_experiment("family-export")
        with mlflow.start_run(experiment_id=exp.experiment_id) as run:
            info, flavor, note, _ = log_model(plain, AutoTokenizer.from_pretrained(str(out)), out, "transformers",
                                              default_pip_requirements(), run_id=run.info.run_id)
        assert flavor == "transformers", note
        loaded, tok = load_registered(info.model_uri, mlflow_uri)
    finally:
        mlflow.set_tracking_uri(None)
    assert type(loaded).__name__ == type(plain).__name__ and tok.eos_token == "<eos>"
    assert torch.equal(_logits(loaded.float()), built)
