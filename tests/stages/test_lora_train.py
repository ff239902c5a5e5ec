"""A LoRA train run end to end on the CPU (tiny synthetic packs, a tiny saved base): adapter-only checkpoints,
SIGKILL right after the first checkpoint + resume → the same loss curve and adapter to the last bit, model/ with
the peft adapter + its base reference + a merged model that loads in plain transformers, and evaluation of the
adapter directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from packtrain.config import EvalConfig, ModelConfig, TelemetryConfig, TrainConfig

V = 101
TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
TRAIN = dict(rows=2, max_steps=6, warmup_steps=1, threads=1, lr=1e-2, activation_checkpointing="full",
             checkpoint={"every_steps": 3, "keep_last": 2},
             adapter={"type": "lora", "r": 4, "alpha": 8.0, "save_merged": True})

SCRIPT = """
import json, sys
from packtrain.config import ModelConfig, TelemetryConfig, TrainConfig
from packtrain.train.loop import train
a = json.loads(sys.argv[1])
train(ModelConfig(**a["model"]), TrainConfig(**a["train"]), None, TelemetryConfig(interval_s=5), a["packs"],
      a["tok"], a["out"], resume=a["resume"])
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from packtrain.model.build import build_model
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("lora")
    tokens_dir, packs_dir = make_synthetic_inputs(root / "syn", n_docs=80, vocab_size=V, budget=64)
    torch.manual_seed(7)
    base = build_model(ModelConfig(**TINY), V)
    base.save_pretrained(root / "base")   # a "released" base: init_from a directory, as a fine-tune does
    model = {**TINY, "init_from": str(root / "base"), "tokenizer_check": "vocab"}
    return tokens_dir, packs_dir, model


def _train(inputs, out: Path, resume=False):
    from packtrain.train.loop import train

    tokens_dir, packs_dir, model = inputs
    return train(ModelConfig(**model), TrainConfig(**TRAIN), None, TelemetryConfig(interval_s=5), packs_dir,
                 tokens_dir / "tokenizer", out, resume=resume)


@pytest.fixture(scope="module")
def straight(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    return out, _train(inputs, out)


def _adapter(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "adapter_model.safetensors"))


def test_lora_run_writes_adapter_only_checkpoints_and_a_loadable_model(inputs, straight):
    out, r = straight
    assert r.steps == 6 and r.setup["adapter"] == "lora" and r.params["trainable"] == 4096
    ck = out / "checkpoints" / "step_000006"
    assert {"adapter.safetensors", "optimizer.pt"} <= {p.name for p in ck.iterdir()}
    assert not (ck / "model.safetensors").exists()
    model_dir = out / "model"
    meta = json.loads((model_dir / "packtrain_adapter.json").read_text())
    assert meta["base"] == str(Path(inputs[2]["init_from"]).resolve()) and meta["merged"] == "merged"
    peft_cfg = json.loads((model_dir / "adapter_config.json").read_text())
    assert peft_cfg["r"] == 4 and peft_cfg["base_model_name_or_path"] == meta["base"]
    assert not (model_dir / "config.json").exists() and not (model_dir / "base").exists()
    assert sum(t.numel() for t in _adapter(model_dir).values()) == 4096

    from transformers import AutoModelForCausalLM

    from packtrain.model.lora import load_adapter_model

    merged = AutoModelForCausalLM.from_pretrained(str(model_dir / "merged"))   # plain transformers
    adapted = load_adapter_model(model_dir, merge=False)
    x = torch.arange(5, 45)[None]
    with torch.no_grad():
        a, b = merged(input_ids=x).logits, adapted(input_ids=x).logits
        base = AutoModelForCausalLM.from_pretrained(inputs[2]["init_from"])(input_ids=x).logits
    assert (a - b).abs().max() <= 1e-4 and (a - base).abs().max() > 1e-3   # the adapter learned something


def test_evaluate_loads_the_adapter_directory(inputs, straight):
    from packtrain.evaluate.perplexity import evaluate

    out, _ = straight
    r = evaluate(out / "model", inputs[1] / "eval", EvalConfig(rows=2, prompts=[], max_batches=2), device="cpu")
    assert r.n_label_tokens > 0 and 1.0 < r.perplexity < V * 2


def test_kill_after_the_first_checkpoint_then_resume_is_exact(inputs, straight, tmp_path):
    ref_out, ref = straight
    tokens_dir, packs_dir, model = inputs
    out = tmp_path / "run"
    arg = json.dumps({"model": model, "train": TRAIN, "packs": str(packs_dir), "tok": str(tokens_dir / "tokenizer"),
                      "out": str(out), "resume": False})
    env = {**os.environ, "PACKTRAIN_FAULT": "checkpoint.renamed"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, arg], env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert (out / "checkpoints" / "step_000003").is_dir() and not (out / "model").exists()
    r = _train(inputs, out, resume=True)
    assert r.start_step == 3
    assert r.loss_curve == ref.loss_curve                      # bitwise
    a, b = _adapter(out / "model"), _adapter(ref_out / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_loss_on_assistant_without_a_loss_mask_is_refused(inputs, tmp_path):
    from packtrain.errors import ConfigError
    from packtrain.train.loop import train

    tokens_dir, packs_dir, model = inputs
    with pytest.raises(ConfigError, match="train.loss_on='assistant'.*no loss mask"):
        train(ModelConfig(**model), TrainConfig(**{**TRAIN, "loss_on": "assistant"}), None,
              TelemetryConfig(interval_s=5), packs_dir, tokens_dir / "tokenizer", tmp_path)
    assert not (tmp_path / "model").exists()


def test_bf16_lora_with_checkpointing_evaluates_in_fp32_during_training(inputs, tmp_path):
    """bf16 training turns peft's per-branch input cast off (model.lora.adapter_input_casts); the recompute of
    checkpointed layers in backward and an fp32 in-training evaluation (no autocast) both still run."""
    from packtrain.train.loop import train

    tokens_dir, packs_dir, model = inputs
    cfg = TrainConfig(**{**TRAIN, "precision": "bf16", "eval_every_steps": 3})
    r = train(ModelConfig(**model), cfg, None, TelemetryConfig(interval_s=5), packs_dir, tokens_dir / "tokenizer",
              tmp_path / "out", eval_cfg=EvalConfig(precision="fp32"))
    curve = r.evaluation["curve"]
    assert [c["step"] for c in curve] == [3, 6] and all(0 < c["eval_loss"] < 20 for c in curve), curve
    assert len(r.loss_curve) == 6 and all(0 < x < 20 for x in r.loss_curve)
