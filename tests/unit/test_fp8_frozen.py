"""LoRA's frozen base in FP8 (train.fp8.lora_base=static, train/fp8_frozen.py) on the CPU, where
torch._scaled_mm runs: products and input gradients within FP8's error of the bf16 ones, no gradient for the
base, the original weight (not the e4m3 one) in state_dict and re-quantized on load, LoRA adapters trained
through it, misaligned linears left alone, the planner's 1 byte a base parameter."""

from __future__ import annotations

import pytest
import torch

from packtrain.train.fp8_frozen import apply_fp8_frozen_base, fp8_frozen_linear


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("m, k, n", [(64, 32, 48), (37, 64, 16), (5, 16, 32)])
def test_product_is_within_fp8_error_for_any_row_count(m, k, n):
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=False).requires_grad_(False)
    x = torch.randn(m, k)
    y = fp8_frozen_linear(lin)(x)                  # rows padded to 16 inside the call, sliced back
    assert y.shape == (m, n) and y.dtype == x.dtype          # the dtype nn.Linear would return (no autocast)
    assert _rel(y, lin(x)) < 0.06                  # e4m3: 3 mantissa bits on both operands


def test_input_gradient_matches_the_bf16_one():
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 32, bias=True).requires_grad_(False)
    x = torch.randn(48, 64, requires_grad=True)
    dy = torch.randn(48, 32)
    lin(x).backward(dy)
    ref = x.grad.clone()
    x.grad = None
    f8 = fp8_frozen_linear(lin)
    out = f8(x)
    torch.testing.assert_close(out.float(), lin(x).detach(), atol=0.15, rtol=0.1)
    out.backward(dy.bfloat16())
    assert x.grad.dtype == x.dtype and _rel(x.grad, ref) < 0.08   # dy in e5m2: 2 mantissa bits
    assert not any(p.requires_grad for p in f8.parameters())


def test_state_dict_holds_the_original_weight_and_loading_requantizes():
    torch.manual_seed(2)
    lin = torch.nn.Linear(32, 16).requires_grad_(False)
    f8 = fp8_frozen_linear(lin)
    sd = f8.state_dict()
    assert set(sd) == {"weight", "bias"}
    assert torch.equal(sd["weight"], lin.weight) and sd["weight"].dtype == lin.weight.dtype
    assert f8.weight_fp8.dtype == torch.float8_e4m3fn and f8.weight_fp8.shape == (16, 32)
    other = torch.nn.Linear(32, 16).requires_grad_(False)
    f8.load_state_dict(other.state_dict())
    assert torch.equal(f8.state_dict()["weight"], other.weight)
    x = torch.randn(16, 32)
    assert _rel(f8(x), other(x)) < 0.06


def test_lora_base_is_swapped_adapters_train_and_misaligned_linears_stay():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from packtrain.train.fp8 import fp8_linear_filter

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])).base_model.model
    ids = torch.randint(0, 64, (1, 32))
    ref = model(input_ids=ids).logits
    names = apply_fp8_frozen_base(model, fp8_linear_filter(model))
    # 16-aligned: the attention projections (64 → 64 / 32); the MLP's 88 is not a multiple of 16
    assert names == [f"model.layers.{i}.self_attn.{p}_proj.base_layer" for i in range(2) for p in "qkvo"]
    assert type(model.get_submodule("model.layers.0.mlp.up_proj.base_layer")).__name__ == "Linear"
    out = model(input_ids=ids).logits
    assert _rel(out, ref) < 0.1
    out.float().square().mean().backward()
    lora_b = model.get_submodule("model.layers.0.self_attn.q_proj").lora_B["default"].weight
    lora_a = model.get_submodule("model.layers.1.self_attn.v_proj").lora_A["default"].weight
    assert lora_a.grad is not None
    assert lora_b.grad is not None and torch.count_nonzero(lora_b.grad) > 0   # B starts at 0: A's grad is 0 at step 0
    keys = model.state_dict().keys()
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" in keys


def test_the_planner_counts_one_byte_per_base_linear_parameter():
    from packtrain.planner.shapes import ModelShape
    from packtrain.planner.states import lora_states

    shape = ModelShape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128_256,
                       tied=False)
    bf16 = lora_states(shape, "bf16", 16, "all-linear", 1, True, 1)
    fp8 = lora_states(shape, "fp8", 16, "all-linear", 1, True, 1, fp8_base=True)
    assert bf16.params - fp8.params == shape.layers * shape.layer_linear_params   # 6.98B bytes: ~6.5 GiB fewer
    assert "e4m3 linears" in fp8.notes["params"]


def test_bad_lora_base_is_refused_naming_the_field():
    from pydantic import ValidationError

    from packtrain.config.train import Fp8Options

    with pytest.raises(ValidationError, match="lora_base"):
        Fp8Options(lora_base="fp8")
