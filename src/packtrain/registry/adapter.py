"""Registering a LoRA run: the registry holds the merged model, the adapter travels as an artifact beside it.

A LoRA train stage writes model/ as (packtrain.model.lora.save_adapter_model):

    model/adapter_config.json, adapter_model.safetensors     peft's adapter (A, B of every target linear)
    model/packtrain_adapter.json                             base location, init_from, loss_on, r/alpha/targets
    model/tokenizer.json, tokenizer_config.json              the tokenizer
    model/base/      (scratch base only)                     the frozen base weights
    model/merged/    (train.adapter.save_merged: true)       base + (alpha/r)·B·A, a plain save_pretrained dir

Registration (packtrain.registry.apply) then:
  - logs and registers `registry_model_dir(model/)` = model/merged: the version loads with
    `AutoModelForCausalLM.from_pretrained` alone, like a full fine-tune's; without merged/ it is a ConfigError
    naming train.adapter.save_merged (the registry holds plain transformers models only);
  - logs the adapter files (not base/ or merged/) as the register run's artifact directory `adapter/` and tags
    the version with `adapter_tags` (packtrain.adapter, packtrain.adapter_artifact = runs:/<run>/adapter), so
    the few-MB adapter can be fetched and applied to the base without the merged weights.

A full fine-tune's model/ (no packtrain_adapter.json) passes through unchanged: `registry_model_dir(d) is d`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from packtrain.errors import ConfigError

ADAPTER_ARTIFACT = "adapter"
"""Artifact directory of the register run that holds the adapter files."""


def check_registrable(cfg) -> None:
    """Before a pipeline that ends by registering (`packtrain run`, the scheduled retrain) runs any stage: a LoRA
    train stage without train.adapter.save_merged writes no merged model, so registration would refuse it
    (registry_model_dir) only after training. A ConfigError now, naming the setting."""
    adapter = cfg.train.adapter
    if adapter.type == "lora" and not adapter.save_merged:
        raise ConfigError("train.adapter.type=lora without train.adapter.save_merged=true: the pipeline ends by "
                          "registering the model and the registry holds plain transformers models (the merged "
                          "model; the adapter is logged beside it) — add --set train.adapter.save_merged=true "
                          "(recipes/sft-tiny-cpu.yaml does), or run `packtrain train` / `packtrain evaluate` alone "
                          "to keep the adapter only")


def registry_model_dir(model_dir: str | Path) -> Path:
    """The directory to log as the registered model: model_dir itself (a full model) or model_dir/merged
    (a LoRA adapter directory trained with train.adapter.save_merged).

    >>> # registry_model_dir("data/train/model")   full fine-tune → data/train/model
    >>> #                                          LoRA + save_merged → data/train/model/merged
    """
    from packtrain.model.lora import read_adapter_meta

    model_dir = Path(model_dir)
    meta = read_adapter_meta(model_dir)
    if meta is None:
        return model_dir
    merged = model_dir / (meta.get("merged") or "merged")
    if not (merged / "config.json").is_file():
        raise ConfigError(f"model directory {model_dir} holds a LoRA adapter without a merged model "
                          f"({merged} is missing): the registry holds plain transformers models — train with "
                          f"--set train.adapter.save_merged=true (recipes/sft-tiny-cpu.yaml does)")
    return merged


def adapter_files(model_dir: Path) -> list[Path]:
    """The adapter's own files in model_dir (adapter config + weights, packtrain_adapter.json, tokenizer):
    everything but the base/ and merged/ subdirectories."""
    return sorted(p for p in Path(model_dir).iterdir() if p.is_file())


def log_adapter(client, run_id: str, model_dir: str | Path) -> dict[str, str]:
    """Log the adapter files of `model_dir` under the run's `adapter/` artifacts (overwritten on a repeat of the
    same op) and return the version tags naming it; {} for a full model."""
    from packtrain.model.lora import read_adapter_meta

    model_dir = Path(model_dir)
    meta = read_adapter_meta(model_dir)
    if meta is None:
        return {}
    tmp = Path(tempfile.mkdtemp(prefix="packtrain-adapter-"))
    try:
        for f in adapter_files(model_dir):   # one log_artifacts call: base/ and merged/ stay out
            shutil.copy2(f, tmp / f.name)
        client.log_artifacts(run_id, str(tmp), ADAPTER_ARTIFACT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return adapter_tags(meta, run_id)


def adapter_tags(meta: dict, run_id: str) -> dict[str, str]:
    """Version tags of a LoRA version, from packtrain_adapter.json.

    >>> adapter_tags({"adapter": {"type": "lora", "r": 8, "alpha": 16, "trainable_params": 19712},
    ...               "init_from": "scratch", "loss_on": "assistant"}, "abc")["packtrain.adapter"]
    'lora r=8 alpha=16'
    """
    a = meta.get("adapter") or {}
    tags = {"packtrain.adapter": f"{a.get('type', 'lora')} r={a.get('r')} alpha={a.get('alpha'):g}"
            if isinstance(a.get("alpha"), (int, float)) else f"{a.get('type', 'lora')} r={a.get('r')}",
            "packtrain.adapter_artifact": f"runs:/{run_id}/{ADAPTER_ARTIFACT}",
            "packtrain.adapter_params": str(a.get("trainable_params", "")),
            "packtrain.adapter_base": str(meta.get("init_from", "")),
            "packtrain.loss_on": str(meta.get("loss_on", ""))}
    return {k: v for k, v in tags.items() if v}
