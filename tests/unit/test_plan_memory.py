"""Memory planner arithmetic: parameter counts vs real transformers models, each component by hand,
choose_shape's rows for train.rows=auto, and the `packtrain plan` CLI."""

from __future__ import annotations

import json

import pytest

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.errors import ConfigError
from packtrain.planner import choose_shape, model_shape, plan_memory
from packtrain.planner import step_bytes as mem
from packtrain.planner.shapes import ModelShape
from packtrain.planner.states import model_states

GIB = 1 << 30


def _cfg(recipe="tiny-cpu", *overrides):
    return load_run_config(recipe, list(overrides))


# ------------------------------------------------------------------------------------------- parameters

@pytest.mark.parametrize("recipe,overrides,vocab", [
    ("tiny-cpu", [], 4096),
    ("tiny-cpu", ["model.tie_word_embeddings=false"], 4096),
    ("tiny-cpu", ["model.num_heads=8", "model.num_kv_heads=2", "model.hidden_size=128"], 1000),
    ("350m-h200", [], 32768),
    ("1b-h200", [], 32768),
])
def test_param_count_matches_transformers_model_on_meta(recipe, overrides, vocab):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    m = _cfg(recipe, *overrides).model
    lc = LlamaConfig(vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                     num_key_value_heads=m.num_kv_heads or m.num_heads,
                     max_position_embeddings=m.max_position_embeddings, tie_word_embeddings=m.tie_word_embeddings)
    with torch.device("meta"):
        model = LlamaForCausalLM(lc)
    real = sum(p.numel() for p in model.parameters())
    shape = model_shape(m, vocab_size=vocab)
    assert shape.n_params == real
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    assert shape.linear_params == linear


def test_param_count_literal_recipes():
    assert model_shape(_cfg().model, vocab_size=4096).n_params == 362_816
    assert model_shape(_cfg("350m-h200").model, vocab_size=32768).n_params == 341_885_952
    assert model_shape(_cfg("1b-h200").model, vocab_size=32768).n_params_nonembed == 822_151_168


def test_pretrained_dir_shape_and_missing_vocab(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 500, "tie_word_embeddings": False}))
    shape = model_shape(_cfg("tiny-cpu", f"model.pretrained_dir={tmp_path}").model)
    assert (shape.kv_hidden, shape.vocab, shape.tied) == (32, 500, False)
    with pytest.raises(ConfigError, match="vocab"):
        model_shape(_cfg().model)


# ------------------------------------------------------------------------------------------- components

SHAPE = ModelShape(hidden=64, intermediate=176, layers=2, heads=4, kv_heads=4, head_dim=16, vocab=4096)
AUTOCAST, FP32, DS16 = (mem.precision_of("torch", "bf16"), mem.precision_of("torch", "fp32"),
                        mem.precision_of("deepspeed", "bf16"))


@pytest.mark.parametrize("prec,backend,expected", [
    # autocast: 30h + 4h_kv + 8I + 4a = 1920 + 256 + 1408 + 16
    (AUTOCAST, "sdpa", 3600),
    (AUTOCAST, "eager", 3584),          # no logsumexp
    # pure bf16: 20h + 4h_kv + 8I + 4a = 1280 + 256 + 1408 + 16
    (DS16, "varlen", 2960),
    # fp32: 32h + 8h_kv + 16I + 4a = 2048 + 512 + 2816 + 16
    (FP32, "flex", 5392),
])
def test_layer_activation_bytes_per_token(prec, backend, expected):
    assert mem.layer_activation_bytes_per_token(SHAPE, prec, backend) == expected


def test_gqa_repeats_kv_only_for_masked_backends():
    gqa = ModelShape(hidden=64, intermediate=176, layers=2, heads=4, kv_heads=1, head_dim=16, vocab=100)
    # sdpa with a packed mask repeats k, v to 4 heads: 30h + 4h + 8I + 4a
    assert mem.layer_activation_bytes_per_token(gqa, AUTOCAST, "sdpa") == 30 * 64 + 4 * 64 + 8 * 176 + 16
    # varlen keeps them at h_kv = 16: 30h + 4·16 + 8I + 4a
    assert mem.layer_activation_bytes_per_token(gqa, AUTOCAST, "varlen") == 30 * 64 + 4 * 16 + 8 * 176 + 16


@pytest.mark.parametrize("backend,prec,expected", [
    ("sdpa", AUTOCAST, 2 * 4 * 512 * 512),        # bf16 additive bias (b, 1, s, s)
    ("sdpa", FP32, 4 * 4 * 512 * 512),
    ("eager", AUTOCAST, 6 * 4 * 4 * 512 * 512),   # fp32 softmax + bf16 copy (b, a, s, s)
    ("eager", FP32, 4 * 4 * 4 * 512 * 512),
    ("varlen", AUTOCAST, 0),
    ("flex", AUTOCAST, 0),
])
def test_attention_quadratic_bytes(backend, prec, expected):
    assert mem.attention_quadratic_bytes(SHAPE, prec, backend, rows=4, budget=512) == expected


def test_loss_bytes_standard_and_chunked():
    n, v = 2048, 4096
    assert mem.loss_bytes(SHAPE, AUTOCAST, n, None) == (10 * n * v, 12 * n * v)
    assert mem.loss_bytes(SHAPE, FP32, n, None) == (8 * n * v, 12 * n * v)
    # chunked: C rows of (C, V) at a time + the (N, h) fp32 gradient of the hidden states
    assert mem.loss_bytes(SHAPE, AUTOCAST, n, 512) == (10 * 512 * v, 12 * 512 * v + 4 * n * 64)


def test_loss_bytes_of_the_torch_fused_kernel():
    """train.loss_kernel=torch: one chunk's bf16 logits + their bf16 gradient, the (N, h) input gradient and the
    fp32 (V, h) weight-gradient accumulator (none when the head is frozen, LoRA)."""
    n, v, h = 2048, 4096, 64
    held = 2 * n * h + 4 * v * h
    assert mem.loss_bytes(SHAPE, AUTOCAST, n, 512, "torch") == (2 * 2 * 512 * v + held, held)
    assert mem.loss_bytes(SHAPE, AUTOCAST, n, 512, "torch", head_trains=False) == (4 * 512 * v + 2 * n * h, 2 * n * h)


def test_model_states_torch_and_zero():
    p = SHAPE.n_params
    t = model_states(SHAPE, "torch", "bf16", 2, False, False, 1, fused=True, grad_accum=1)
    assert (t.params, t.grads, t.optimizer, t.step_workspace, t.persistent_grads) == (4 * p, 4 * p, 8 * p, 0, 0)
    assert model_states(SHAPE, "torch", "bf16", 2, False, False, 1, fused=False, grad_accum=4).step_workspace == 4 * p
    z2 = model_states(SHAPE, "deepspeed", "bf16", 2, False, False, 4, fused=True, grad_accum=1,
                      overlap_comm=True, reduce_bucket=1000)
    assert (z2.params, z2.master, z2.optimizer, z2.grads) == (2 * p, 4 * p // 4, 8 * p // 4, 4 * p // 4)
    assert z2.zero_buffers == 2 * 1000 * 2                # two bf16 reduce buckets with overlap_comm
    z3 = model_states(SHAPE, "deepspeed", "bf16", 3, True, True, 4, fused=True, grad_accum=1,
                      reduce_bucket=1000, prefetch_bucket=10)
    assert (z3.params, z3.master, z3.optimizer, z3.grads) == (0, 0, 0, 0)
    assert z3.cpu == (4 + 8 + 4 + 2) * p // 4
    assert z3.zero_buffers == 1000 * 2 + 2 * p                  # bucket + every parameter gathered (p < 1e9)
    big = model_states(SHAPE, "deepspeed", "bf16", 3, True, True, 4, fused=True, grad_accum=1,
                       reduce_bucket=1000, max_live=1000)
    assert big.zero_buffers == 1000 * 2 + 2 * 1000              # capped by stage3_max_live_parameters


def test_plan_sums_components_by_hand():
    """tiny-cpu, fp32 on CPU, 4 × 512, standard loss: the peak is the loss backward, summed by hand."""
    cfg = _cfg("tiny-cpu", "train.device=cpu")
    plan = plan_memory(cfg.model, cfg.train, 512, cfg.plan, 80, vocab_size=4096)
    n, h, v, p = 4 * 512, 64, 4096, 362_816
    layer = 5392 * n + 4 * 4 * 512 * 512          # fp32 per-layer bytes + fp32 sdpa bias
    head = (12 * h + 2 * 16 * 4 + 4 * 5 + 32) * n  # norm in/out + head input, cos/sin, 1/rms, ids
    expected = 4 * p + 8 * p + 2 * layer + head + 12 * n * v
    assert plan.peak_phase == "loss backward"
    assert plan.peak_allocated == expected
    assert sum(plan.components.values()) == plan.peak_allocated
    assert plan.peak == expected + int(expected * 0.05)   # no CUDA context on CPU
    assert plan.fits


def test_checkpointing_keeps_only_layer_inputs():
    cfg = _cfg("350m-h200", "train.activation_checkpointing=full")
    plan = plan_memory(cfg.model, cfg.train, 2048, cfg.plan, 80, vocab_size=32768)
    assert plan.checkpointed_layers == 24
    assert plan.checkpointed_layer_bytes == 4 * 1024 * 8 * 2048     # fp32 residual (N, h)
    none = plan_memory(cfg.model, cfg.train.model_copy(update={"activation_checkpointing": "none"}), 2048,
                       cfg.plan, 80, vocab_size=32768)
    assert plan.peak_allocated < 0.6 * none.peak_allocated


# ------------------------------------------------------------------------------------------- rows=auto

def test_auto_rows_largest_fitting_for_the_packs_budget():
    cfg = _cfg("350m-h200", "train.rows=auto")
    s = choose_shape(cfg.model, cfg.train, 2048, cfg.plan, 32768, device_memory_gib=80)
    assert (s.budget, s.rows, s.grad_accum, s.source) == (2048, 36, 1, "auto")   # the module docstring's example
    assert s.plan.fits and (s.plan.rows, s.plan.budget, s.plan.grad_accum) == (36, 2048, 1)
    more = plan_memory(cfg.model, cfg.train, 2048, cfg.plan, 80, vocab_size=32768, rows=37)
    assert not more.fits


def test_auto_rows_keeps_the_global_batch():
    cfg = _cfg("350m-h200", "train.rows=auto", "plan.global_batch_tokens=262144")
    s = choose_shape(cfg.model, cfg.train, 2048, cfg.plan, 32768, device_memory_gib=80)
    assert (s.rows, s.grad_accum, s.tokens_per_step) == (32, 4, 262144)   # 128 packs: 64 × 2, 43 × 3 do not fit
    capped = choose_shape(cfg.model, cfg.train.model_copy(update={"activation_checkpointing": "full"}), 2048,
                          cfg.plan.model_copy(update={"max_rows": 16}), 32768, device_memory_gib=80)
    assert (capped.rows, capped.grad_accum) == (16, 8)


def test_auto_rows_nothing_fits_names_peak_and_suggestion():
    cfg = _cfg("1b-h200", "train.rows=auto")
    with pytest.raises(ConfigError, match=r"not even 1 row fits: 1 row × 2048 tokens \(the packs' budget\) needs "
                                          r"[\d.]+ GiB") as e:
        choose_shape(cfg.model, cfg.train, 2048, cfg.plan, 32768, device_memory_gib=8)
    assert "--set " in str(e.value) and "pack.budget" in str(e.value)


def test_plan_suggests_changes_when_it_does_not_fit():
    cfg = _cfg("1b-h200", "train.rows=32", "train.loss=standard")
    plan = plan_memory(cfg.model, cfg.train, 4096, cfg.plan, 80, vocab_size=32768)
    assert not plan.fits
    changes = {a["change"] for a in plan.alternatives}
    assert "--set train.activation_checkpointing=full" in changes and "--set train.loss=chunked" in changes
    assert "GiB" in plan.suggestion
    peak = {a["change"].rsplit("=", 1)[1]: a["peak_gib"] for a in plan.alternatives if "checkpointing" in a["change"]}
    assert peak["full"] < peak["selective"] < plan.peak_gib   # selective keeps the products: between the two


# ------------------------------------------------------------------------------------------- CLI

def test_plan_cli_table_json_and_out(tmp_path, capsys):
    assert main(["plan", "--recipe", "350m-h200", "--device-memory-gib", "80", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for word in ("parameters", "optimizer states", "activations", "logits loss", "allocated peak", "fits"):
        assert word in out
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["budget"] == 2048 and saved["shape"]["n_params"] == 341_885_952
    assert main(["plan", "--recipe", "350m-h200", "--rows", "auto", "--device-memory-gib", "80", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["fits"] and (chosen["budget"], chosen["rows"], chosen["rows_source"]) == (2048, 36, "auto")
    assert chosen["tokens_per_step"] == 36 * 2048


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--budget", "0"], "--budget 0: --set pack.budget=0: pack.budget: 0 is not allowed"),
    (["plan", "--budget", "big"], "pack.budget: 'big' is not allowed"),
    (["plan", "--budget", "auto"], "--budget auto: a budget is tokens per pack"),
    (["plan", "--rows", "0"], "--rows 0: --set train.rows=0: train.rows: 0 is not allowed"),
    (["plan", "--device-memory-gib", "-1"], "--device-memory-gib"),
    (["plan", "--set", "plan.target_fraction=1.5"], "plan.target_fraction"),
])
def test_plan_cli_bad_input(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
