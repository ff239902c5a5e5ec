"""Which directory a registration logs for a LoRA run, and what it refuses (packtrain.registry.adapter)."""

from __future__ import annotations

import json

import pytest

from packtrain.errors import ConfigError
from packtrain.registry.adapter import adapter_files, adapter_tags, registry_model_dir


def _adapter_dir(root, merged: bool):
    d = root / "model"
    d.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
        (d / name).write_text("{}")
    meta = {"format": "packtrain.adapter", "base": "base", "init_from": "scratch", "loss_on": "assistant",
            "merged": "merged" if merged else None,
            "adapter": {"type": "lora", "r": 8, "alpha": 16.0, "trainable_params": 19712}}
    (d / "packtrain_adapter.json").write_text(json.dumps(meta))
    (d / "base").mkdir()
    (d / "base" / "config.json").write_text("{}")
    if merged:
        (d / "merged").mkdir()
        (d / "merged" / "config.json").write_text("{}")
    return d


def test_full_model_dir_is_registered_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert registry_model_dir(tmp_path) == tmp_path


def test_lora_dir_registers_its_merged_model_and_logs_only_adapter_files(tmp_path):
    d = _adapter_dir(tmp_path, merged=True)
    assert registry_model_dir(d) == d / "merged"
    assert [p.name for p in adapter_files(d)] == ["adapter_config.json", "adapter_model.safetensors",
                                                  "packtrain_adapter.json", "tokenizer.json"]


def test_lora_dir_without_merged_model_is_refused_naming_the_switch(tmp_path):
    d = _adapter_dir(tmp_path, merged=False)
    with pytest.raises(ConfigError, match=r"train\.adapter\.save_merged=true") as e:
        registry_model_dir(d)
    assert str(d) in str(e.value)


def test_version_tags_name_the_adapter_and_its_artifact():
    meta = {"adapter": {"type": "lora", "r": 8, "alpha": 16.0, "trainable_params": 19712},
            "init_from": "models:/packtrain-lm/3", "loss_on": "assistant"}
    assert adapter_tags(meta, "0f1e") == {
        "packtrain.adapter": "lora r=8 alpha=16", "packtrain.adapter_artifact": "runs:/0f1e/adapter",
        "packtrain.adapter_params": "19712", "packtrain.adapter_base": "models:/packtrain-lm/3",
        "packtrain.loss_on": "assistant"}
