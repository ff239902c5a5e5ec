"""`model.init_from`: its syntax is checked when the config loads, its source when the model is built; every
bad source is a clear error naming the field, never a transformers traceback."""

from __future__ import annotations

import json

import pytest
import torch

from packtrain.config import ModelConfig, load_run_config
from packtrain.errors import ConfigError, MissingDataError
from packtrain.model.build import build_model
from packtrain.model.init_from import resolve_init_source
from packtrain.testing.tiny_families import build_tiny_family_dir

V = 97


@pytest.mark.parametrize("value", ["scratch", "champion", "models:/packtrain-lm@champion", "models:/lm/3",
                                   "/data/models/qwen2-0.5b", "relative/dir", "C:/models/x"])
def test_family_init_from_syntax_accepted(value):
    assert load_run_config("tiny-cpu", [f"model.init_from={value}"]).model.init_from == value


@pytest.mark.parametrize("value", ["models:/lm", "models:/lm@", "models:/lm/0", "models:/lm/v2", "models:lm@x",
                                   "hf://Qwen/Qwen2-0.5B", "s3://bucket/model", "runs:/abc/model", "''", "'  '"])
def test_family_init_from_syntax_refused(value):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [f"model.init_from={value}"])
    assert "model.init_from: " in str(e.value) and "is not allowed: must be 'scratch', 'champion', " \
        "models:/NAME@ALIAS, models:/NAME/VERSION or a local save_pretrained directory" in str(e.value)


def test_family_pretrained_dir_is_a_deprecated_alias(tmp_path):
    cfg = load_run_config("tiny-cpu", [f"model.pretrained_dir={tmp_path}"]).model
    assert (cfg.init_from, cfg.pretrained_dir) == (str(tmp_path), None)
    with pytest.raises(ConfigError, match="disagree: set init_from only"):
        load_run_config("tiny-cpu", [f"model.pretrained_dir={tmp_path}", "model.init_from=champion"])
    # a model_copy bypasses validation: the resolver still honours the old field
    d = build_tiny_family_dir(tmp_path / "llama", "llama", vocab_size=V)
    assert resolve_init_source(ModelConfig().model_copy(update={"pretrained_dir": str(d)})) == d


def test_family_missing_sources(tmp_path):
    with pytest.raises(MissingDataError, match="model.init_from '.*nope': no such directory; a local save_pretrained "
                                               "directory is needed \\(nothing is downloaded from a hub"):
        build_model(ModelConfig(init_from=str(tmp_path / "nope")), V)
    with pytest.raises(MissingDataError, match="no config.json"):
        build_model(ModelConfig(init_from=str(tmp_path)), V)
    for value in ("champion", "models:/lm@champion", "models:/lm/2"):
        with pytest.raises(ConfigError, match=f"model.init_from '{value}': a registry source is resolved with the "
                                              "run config"):
            resolve_init_source(ModelConfig(init_from=value))


@pytest.mark.parametrize("config,words", [
    ({"model_type": "not_a_model", "hidden_size": 8}, "config.json cannot be read by transformers"),
    ({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100},
     "model_type 'gpt2' is not a family packtrain trains; supported: llama, mistral, qwen2, qwen3, gemma2, "
     "gemma3_text, phi3"),
    ({"model_type": "gemma3", "text_config": {"hidden_size": 32}}, "save its text model, Gemma3ForCausalLM"),
])
def test_family_unknown_or_unsupported_architecture(tmp_path, config, words):
    (tmp_path / "config.json").write_text(json.dumps(config))
    before = (tmp_path / "config.json").read_bytes()
    with pytest.raises(ConfigError) as e:
        build_model(ModelConfig(init_from=str(tmp_path)), V)
    assert words in str(e.value) and str(tmp_path) in str(e.value), str(e.value)
    assert (tmp_path / "config.json").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json"]


def test_family_vocab_smaller_than_the_token_store(tmp_path):
    d = build_tiny_family_dir(tmp_path / "q", "qwen2", vocab_size=V)
    with pytest.raises(ConfigError, match=f"vocab_size {V} < the tokenizer's {V + 3}; re-tokenize with that "
                                          "model's tokenizer"):
        build_model(ModelConfig(init_from=str(d)), V + 3)


def test_family_checkpoint_loads_with_its_weights_fp32_and_no_cache(tmp_path):
    from transformers import AutoModelForCausalLM

    d = build_tiny_family_dir(tmp_path / "m", "qwen3", vocab_size=V)
    model = build_model(ModelConfig(init_from=str(d)), V, attention="flex", training=False)
    plain = AutoModelForCausalLM.from_pretrained(str(d))
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config._attn_implementation == "packtrain_flex"
    assert model.config.use_cache is False and model.dtype == torch.float32
    for (k, a), b in zip(plain.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
