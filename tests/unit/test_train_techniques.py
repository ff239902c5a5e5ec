"""Techniques that must not change numerics (activation checkpointing, chunked loss) and those that must run
(bf16 autocast, fp16 + GradScaler, compile with a recompile counter), on the CPU with a tiny model."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig, TelemetryConfig, TrainConfig
from packtrain.model.attention import model_inputs
from packtrain.model.build import build_model
from packtrain.packing.batches import build_batch, token_loss_sum
from packtrain.train import techniques as tq
from packtrain.train.loss import lm_loss_sum, next_token_targets, packed_causal_lm

V = 101
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2)


def _batch(seed=0, budget=48):
    rng = np.random.default_rng(seed)
    rows = [[7, 20, 13], [30, 18], [5, 5, 5, 5]]
    return build_batch([rng.integers(0, V, sum(r)) for r in rows], [np.array(r) for r in rows], budget)


@functools.cache
def _loss_and_grads(ac: str, loss: str = "standard", chunk: int = 2048):
    torch.manual_seed(0)
    model = build_model(MODEL, V)
    tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing=ac, ac_every_k=2))
    module = packed_causal_lm(model, loss, chunk)
    b = _batch()
    out = module(labels=b.labels, **model_inputs(b, "sdpa"))
    out.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("ac", ["full", "every_k"])
def test_activation_checkpointing_keeps_loss_and_grads_bitwise(ac):
    ref_loss, ref_grads = _loss_and_grads("none")
    loss, grads = _loss_and_grads(ac)
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    worst = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads)
    assert worst <= 1e-6, f"max grad difference {worst}"


def test_activation_checkpointing_wraps_the_chosen_layers_only():
    assert tq.checkpointed_layer_indices(5, "every_k", 2) == [0, 2, 4]
    assert tq.checkpointed_layer_indices(4, "full") == [0, 1, 2, 3]
    assert tq.checkpointed_layer_indices(4, "none") == []
    model = build_model(MODEL, V)
    keys = list(model.state_dict())
    idx = tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing="every_k", ac_every_k=3))
    assert idx == [0, 3]
    assert [getattr(layer, "_packtrain_ac", False) for layer in model.model.layers] == [True, False, False, True]
    assert list(model.state_dict()) == keys   # checkpoints and save_pretrained see the same keys


WIDE = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4)


def _backward_matmul_flops(ac: str, precision: str = "fp32"):
    """Loss, gradients and the FLOPs of every mm/addmm run during backward (recompute included)."""
    from bench.saved_graph import op_counter

    torch.manual_seed(0)
    model = build_model(WIDE, V)
    tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing=ac))
    module = packed_causal_lm(model)
    b = _batch()
    with tq.autocast(precision, "cpu"):
        out = module(labels=b.labels, **model_inputs(b, "sdpa"))
    with op_counter() as count:
        out.backward()
    # matrix-product FLOPs, attention forwards re-run
    flops = (count.matmul_flops(), count.calls["_scaled_dot_product_flash_attention_for_cpu"])
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, flops


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_selective_checkpointing_is_bitwise_and_recomputes_no_matmul(precision):
    """train.activation_checkpointing=selective: the same loss and gradients bit for bit as no checkpointing, and
    backward runs exactly no-checkpointing's matrix products and no attention forward (full re-runs both); what
    it keeps is checked against torch's real cache in tests/bench/test_saved_graph.py."""
    ref_loss, ref_grads, ref_flops = _backward_matmul_flops("none", precision)
    loss, grads, flops = _backward_matmul_flops("selective", precision)
    _, _, full_flops = _backward_matmul_flops("full", precision)
    assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
    assert all(torch.equal(grads[k], ref_grads[k]) for k in grads)
    assert flops[0] == ref_flops[0] < full_flops[0], (flops, ref_flops, full_flops)
    assert flops[1] == ref_flops[1] == 0 < full_flops[1]   # the attention is not re-run either
    assert tq.checkpointed_layer_indices(3, "selective") == [0, 1, 2]


@pytest.mark.parametrize("chunk", [1, 37, 144])
def test_chunked_loss_equals_standard_in_fp32(chunk):
    ref_loss, ref_grads = _loss_and_grads("none", "standard")
    loss, grads = _loss_and_grads("none", "chunked", chunk)
    assert torch.equal(loss, ref_loss), f"chunk {chunk}: {loss.item()!r} vs {ref_loss.item()!r}"
    # The LM-head (= tied embedding) gradient is summed over chunks instead of in one matmul: equal up to
    # summation order (measured ≤ 4e-7 relative); every other gradient is bitwise equal.
    for k in grads:
        scale = ref_grads[k].abs().max().item()
        assert (grads[k] - ref_grads[k]).abs().max().item() <= 2e-6 * max(scale, 1.0), k


def test_loss_matches_the_packing_rooms_reference_and_counts_label_tokens():
    torch.manual_seed(0)
    model = build_model(MODEL, V)
    b = _batch()
    with torch.no_grad():
        hidden = model.model(**model_inputs(b, "sdpa")).last_hidden_state
        mine = lm_loss_sum(hidden, model.lm_head, b.labels)
        ref = token_loss_sum(model.lm_head(hidden).reshape(1, -1, V), b.labels)
    assert torch.allclose(mine, ref, rtol=1e-6)
    assert int((next_token_targets(b.labels) != -100).sum()) == b.n_label_tokens


def test_lr_schedule_table():
    got = [round(tq.lr_factor(s, warmup=2, total=6, min_ratio=0.1), 3) for s in range(8)]
    assert got == [0.5, 1.0, 1.0, 0.868, 0.55, 0.232, 0.1, 0.1]


def test_optimizer_decays_only_matrices():
    model = build_model(MODEL, V)
    opt = tq.build_optimizer(model, TrainConfig(weight_decay=0.1), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))   # tied once


def test_compile_counts_recompiles():
    counter = tq.CompileCounter().start()
    try:
        f = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
        for n in (4, 4, 8, 4):
            f(torch.ones(n))
    finally:
        counter.stop()
    assert (counter.compiles, counter.recompiles) == (2, 1)   # 4 compiled, then 8 recompiled, 4 cached


def test_compiled_layers_keep_the_loss_and_compile_once():
    torch.manual_seed(0)
    model = build_model(MODEL, V)
    b = _batch()
    module = packed_causal_lm(model)
    with torch.no_grad():
        eager = module(labels=b.labels, **model_inputs(b, "sdpa"))
    counter = tq.apply_compile(model, TrainConfig(compile=True), backend="eager")
    try:
        with torch.no_grad():
            for seed in (1, 2):   # new data, same shape
                module(labels=b.labels, **model_inputs(_batch(seed), "sdpa"))
            again = module(labels=b.labels, **model_inputs(b, "sdpa"))
    finally:
        counter.stop()
    assert torch.allclose(again, eager, rtol=1e-6)
    assert counter.compiles >= 1 and counter.recompiles == 0, counter.ids
    assert tq.apply_compile(model, TrainConfig(compile=False)) is None


def test_allocator_env_is_set_once_and_respects_the_user(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert tq.set_allocator_env(TrainConfig()) is True
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert tq.set_allocator_env(TrainConfig()) is False
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert tq.set_allocator_env(TrainConfig(expandable_segments=False)) is False
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    return make_synthetic_inputs(tmp_path_factory.mktemp("syn"), n_docs=120, vocab_size=V, budget=64)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(synthetic, tmp_path, precision):
    from packtrain.train.loop import train

    tokens_dir, packs_dir = synthetic
    cfg = TrainConfig(precision=precision, rows=2, max_steps=3, warmup_steps=1, threads=1)
    r = train(MODEL, cfg, None, TelemetryConfig(interval_s=5), packs_dir, tokens_dir / "tokenizer", tmp_path)
    assert r.steps == 3 and len(r.loss_curve) == 3 and all(np.isfinite(r.loss_curve))
    assert r.setup["precision"] == precision and r.final_loss < np.log(V) + 1
    assert r.skipped_steps >= 0 and r.tokens > 0
    scales = [h["loss_scale"] for h in r.history]
    if precision == "fp16":
        assert all(s is not None and s > 0 for s in scales)   # GradScaler active; skipped steps counted
    else:
        assert scales == [None] * 3
