"""register.flavor=files (the default): the exported directory is logged as it is — its files copied, the weights
never loaded or re-saved — and reads back as the transformers-flavor versions logged before it did.

A real sqlite MLflow store in tmp; a tiny Llama saved in bf16 (what a GPU run exports) with its byte-level BPE;
registered through `registry_helpers.register_model_dir` (the register stage's op, applied): v1 with the default flavor, v2 the same
directory with flavor=transformers (the in-memory re-save every earlier version was logged with).
"""

from __future__ import annotations

import json

import pytest
import torch

from packtrain.config import RegisterConfig
from packtrain.data.tokenizer_files import TOKENIZER_FILES

TEXTS = ["def area(r):\n    return 3.14159 * r * r\n", "The quick brown fox jumps over the lazy dog. "] * 4
PROMPTS = ["def ", "The "]


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    from registry_helpers import register_model_dir as register_model
    from transformers import AutoModelForCausalLM

    from packtrain.testing.tiny_model import build_tiny_model_dir
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    tmp_path = tmp_path_factory.mktemp("register-files")
    exported = build_tiny_model_dir(tmp_path / "model", TEXTS)
    AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.bfloat16).save_pretrained(str(exported))
    gen = json.loads((exported / "generation_config.json").read_text())   # the model's own: 8 new tokens, not
    (exported / "generation_config.json").write_text(json.dumps({**gen, "max_new_tokens": 8}))   # ~2,000 (14 s)
    (exported / "notes.txt").write_text("not a model file: stays out of the registry\n")
    before = {p.name: p.read_bytes() for p in exported.iterdir()}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:   # module scope: the autouse isolation is not active yet
        mp.chdir(tmp_path)                      # a new experiment's artifacts go under ./mlruns
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(uri)
        files = register_model(exported, {"eval_loss": 3.0, "perplexity": 20.1}, None, RegisterConfig(model_name="lm"))
        old = register_model(exported, {"eval_loss": 3.0, "perplexity": 20.1}, None,
                             RegisterConfig(model_name="lm", flavor="transformers"))
        set_fluent_tracking_uri("")
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before   # the input is left as it was
    return {"uri": uri, "dir": exported, "files": files, "old": old, "root": tmp_path}


def _download(uri: str, model_uri: str, dst):
    import mlflow

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    set_fluent_tracking_uri(uri)
    try:
        return mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst))
    finally:
        set_fluent_tracking_uri("")


def _logits(model):
    ids = torch.tensor([[5, 9, 12, 40, 77]])
    with torch.no_grad():
        return model.eval()(ids, use_cache=False).logits


def test_the_logged_files_are_the_exported_files(registered, tmp_path):
    from pathlib import Path

    from mlflow.models import Model

    r, exported = registered["files"], registered["dir"]
    assert (r.version, r.flavor, registered["old"].flavor) == ("1", "files", "transformers")
    assert r.version_tags["flavor"] == "files" and float(r.version_tags["log_model_s"]) == pytest.approx(r.log_model_s, abs=1e-3)
    local = Path(_download(registered["uri"], "models:/lm/1", tmp_path / "v1"))
    weights = sorted(p.name for p in exported.iterdir() if p.name != "notes.txt")
    assert "model.safetensors" in weights and sorted(p.name for p in (local / "model").iterdir()) == weights
    for name in weights:   # byte for byte: nothing was loaded and saved again (bf16 stays bf16)
        assert (local / "model" / name).read_bytes() == (exported / name).read_bytes(), name
    toks = [n for n in TOKENIZER_FILES if (exported / n).is_file()]
    assert toks and all((local / "components" / "tokenizer" / n).read_bytes() == (exported / n).read_bytes()
                        for n in toks)
    flavors = Model.load(str(local)).flavors
    assert flavors["python_function"]["loader_module"] == "mlflow.transformers"
    assert flavors["transformers"]["pipeline_model_type"] == "LlamaForCausalLM"
    # the in-memory flavor re-saved the weights in fp32: twice the bytes
    old = Path(_download(registered["uri"], "models:/lm/2", tmp_path / "v2"))
    assert (old / "model" / "model.safetensors").stat().st_size > 1.9 * (exported / "model.safetensors").stat().st_size


def test_pyfunc_predict_keeps_the_transformers_contract(registered):
    import mlflow
    import pandas as pd

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    set_fluent_tracking_uri(registered["uri"])
    try:
        new = mlflow.pyfunc.load_model("models:/lm/1")
        old = mlflow.pyfunc.load_model("models:/lm/2")
    finally:
        set_fluent_tracking_uri("")
    def predict(model, data):   # the pipeline samples: the same seed draws the same tokens from the same logits
        torch.manual_seed(0)
        return model.predict(data)

    out = predict(new, PROMPTS)
    assert isinstance(out, list) and len(out) == 2
    assert all(isinstance(t, str) and t.startswith(p) and len(t) > len(p) for t, p in zip(out, PROMPTS, strict=True))
    # from the same fp32 weights and tokenizer: the very texts of the version logged the old way
    assert out == predict(old, PROMPTS)
    assert predict(new, pd.DataFrame({"prompt": PROMPTS})) == out
    assert predict(new, PROMPTS[0]) == out[:1]


def test_packtrain_loaders_read_the_files_version(registered):
    from packtrain.config import load_run_config
    from packtrain.evaluate.loading import load_model_dir
    from packtrain.registry.model import load_registered
    from packtrain.registry.source import SOURCE_FILE, resolve_init

    model, tok = load_registered("models:/lm/1", registered["uri"])
    ref, ref_tok = load_model_dir(registered["dir"], "cpu")
    assert model.dtype == torch.float32 and torch.equal(_logits(model), _logits(ref))
    assert tok("def x").input_ids == ref_tok("def x").input_ids
    old, _ = load_registered("models:/lm/2", registered["uri"])
    assert torch.equal(_logits(old), _logits(model))
    # model.init_from: the version comes back as the exported directory, byte for byte
    cfg = load_run_config("tiny-cpu", [f"workdir={registered['root'] / 'wd'}", "register.model_name=lm",
                                       f"tracking.tracking_uri={registered['uri']}", "model.init_from=models:/lm/1"])
    src = resolve_init(cfg, announce=False)
    got = {p.name for p in src.path.iterdir()} - {SOURCE_FILE}
    assert got == {p.name for p in registered["dir"].iterdir()} - {"notes.txt"}
    assert all((src.path / n).read_bytes() == (registered["dir"] / n).read_bytes() for n in got)


def test_a_directory_the_files_flavor_cannot_take_is_loaded_and_re_saved(registered, tmp_path, monkeypatch):
    import shutil

    from registry_helpers import register_model_dir as register_model

    from packtrain.registry.model import load_registered
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    d = shutil.copytree(registered["dir"], tmp_path / "no-arch")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["architectures"]   # which class loads it: what the files flavor must name (AutoModel reads model_type)
    (d / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(registered["root"])
    set_fluent_tracking_uri(registered["uri"])
    try:
        r = register_model(d, {"eval_loss": 3.0, "perplexity": 20.1}, None, RegisterConfig(model_name="lm-fallback"))
    finally:
        set_fluent_tracking_uri("")
    assert r.flavor == "transformers" and r.flavor_note.startswith("files flavor not possible (model directory "
                                                                   f"{d}: config.json has no `architectures`")
    model, _ = load_registered("models:/lm-fallback/1", registered["uri"])
    assert torch.equal(_logits(model), _logits(load_registered("models:/lm/1", registered["uri"])[0]))
