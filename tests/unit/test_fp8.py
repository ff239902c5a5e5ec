"""FP8 training (train.precision=fp8, packtrain.train.fp8): the refusal off FP8 hardware, which linears torchao
converts (names), that checkpoints and model/ do not change, that the converted model composes with activation
checkpointing and the chunked loss, the MFU arithmetic under FP8 and the planner's treatment (as bf16).

torchao's float8 casts and `torch._scaled_mm` also run on the CPU (slowly, emulated): the conversion tests run a
real forward/backward of the tiny converted model here; the speed is measured on the GPU (python -m bench fp8)."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig, PlanConfig, TelemetryConfig, TrainConfig
from packtrain.config.train import Fp8Options
from packtrain.errors import ConfigError
from packtrain.train.fp8 import apply_fp8, check_fp8_support, fp8_param_count

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao (the fp8 extra) is not installed")
ATTN = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"]


def tiny_llama(intermediate: int = 88):
    """h 64, 4/2 heads, 2 layers, untied 96-token head: the head's 64 → 96 is 16-aligned, so only its name keeps
    it out; intermediate 88 is not 16-aligned, so the MLP stays bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def float8_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]


# ------------------------------------------------------------------------------------------ refusal
def test_cpu_is_refused_naming_what_is_needed_and_the_alternative():
    with pytest.raises(ConfigError) as e:
        check_fp8_support(torch.device("cpu"))
    msg = str(e.value)
    assert "train.precision=fp8" in msg and "compute capability ≥ 8.9" in msg
    assert "cpu" in msg and "train.precision=bf16" in msg


def test_fp8_with_deepspeed_is_refused_at_load_time():
    with pytest.raises(ValueError, match="train.engine=torch"):
        TrainConfig(precision="fp8", engine="deepspeed")
    assert TrainConfig(precision="fp8").fp8.recipe == "tensorwise"


# ------------------------------------------------------------------------------------------ conversion
@needs_torchao
def test_converts_the_aligned_decoder_linears_only():
    model = tiny_llama()
    names = apply_fp8(model, Fp8Options())
    assert names == ATTN                                   # 8 projections; gate/up/down (88 wide) stay
    assert float8_names(model) == ATTN
    assert type(model.lm_head) is torch.nn.Linear          # 16-aligned but the LM head: never converted
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert fp8_param_count(model, names) == 2 * (2 * 64 * 64 + 2 * 64 * 32)   # q, o 64×64; k, v 64×32
    assert apply_fp8(model, Fp8Options()) == []            # idempotent: nothing left to convert
    aligned = tiny_llama(intermediate=96)
    assert len(apply_fp8(aligned, Fp8Options(recipe="rowwise"))) == 14   # + gate/up/down per layer
    cfg = aligned.model.layers[1].mlp.up_proj.config
    assert cfg.cast_config_input.scaling_granularity.value == "axiswise"   # rowwise recipe applied


@needs_torchao
def test_state_dict_keys_and_values_unchanged():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fp8(model, Fp8Options())
    after = model.state_dict()
    assert list(after) == list(before)                     # same keys, same order: checkpoints load either way
    assert all(torch.equal(after[k], before[k]) and after[k].dtype == torch.float32 for k in before)


@needs_torchao
def test_saved_model_is_plain_transformers(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model = tiny_llama()
    plain = copy.deepcopy(model)
    apply_fp8(model, Fp8Options())
    model.save_pretrained(tmp_path, safe_serialization=True)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes == {torch.float32}                       # master weights, no float8 tensors or scales
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not float8_names(loaded)
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids, use_cache=False).logits, plain(ids, use_cache=False).logits)


@needs_torchao
def test_converted_model_trains_with_checkpointing_and_chunked_loss():
    """One packed step: FP8 forward/backward under activation checkpointing + the chunked loss gives the bf16
    model's loss within 2% and finite gradients on every parameter (CPU emulation of the float8 matmuls)."""
    from packtrain.packing.batches import build_batch
    from packtrain.train.loss import packed_causal_lm
    from packtrain.train.techniques import apply_activation_checkpointing

    rng = np.random.default_rng(0)
    batch = build_batch([rng.integers(2, 96, 30), rng.integers(2, 96, 32)], [np.array([12, 18]), np.array([32])],
                        budget=32)
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    model = tiny_llama(intermediate=96)
    plain = copy.deepcopy(model)
    names = apply_fp8(model, Fp8Options())
    assert apply_activation_checkpointing(model, TrainConfig(activation_checkpointing="full")) == [0, 1]
    losses = []
    for m in (model, plain):
        loss = packed_causal_lm(m, "chunked", chunk_tokens=16)(labels=batch.labels, **inputs)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=0.02) and losses[0] != losses[1]   # FP8 rounding, small
    for name in names:
        g = model.get_submodule(name).weight.grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@needs_torchao
def test_lora_adapters_stay_out_frozen_base_converts():
    from packtrain.config.train import AdapterConfig
    from packtrain.model.lora import apply_adapter

    model = tiny_llama()
    apply_adapter(model, AdapterConfig(type="lora", r=16), base_dtype=torch.bfloat16)
    names = apply_fp8(model, Fp8Options())
    assert names == [f"{n.rsplit('.', 1)[0]}.{n.rsplit('.', 1)[1]}.base_layer" for n in ATTN]
    assert not any("lora_" in n for n in float8_names(model))


# ------------------------------------------------------------------------------------------ MFU and planner
def test_time_weighted_peak_and_the_3b_worked_number():
    from packtrain.telemetry.mfu import fp8_peak_flops, step_flops, time_weighted_peak

    assert time_weighted_peak(3.0, 2.0, 2.0, 1.0) == 1.5   # ideal 2/2 + 1/1 = 2 s for 3 FLOPs
    assert time_weighted_peak(5.0, 0.0, 2.0, 1.0) == 1.0 and time_weighted_peak(5.0, 5.0, 2.0, 1.0) == 2.0
    assert fp8_peak_flops("NVIDIA H200") == pytest.approx(1978.9e12)
    assert fp8_peak_flops("NVIDIA H200", 790.0) == pytest.approx(790e12 * 1978.9 / 989.4)   # override = bf16
    # docs/fp8.md: Llama-3B shape (h 3072, 28 layers, 24/8 heads, i 8192, V 32768), 8 full rows of 2048
    n8 = 28 * (2 * 3072**2 + 2 * 3072 * 1024 + 3 * 3072 * 8192)
    n = n8 + 28 * 2 * 3072 + 3072
    _, dense = step_flops(n, 28, 3072, [2048] * 8, 8 * 2048, 2048, 32768)
    assert n8 == 2_818_572_288 and dense == pytest.approx(3.2162e14, rel=1e-4)
    assert time_weighted_peak(dense, 6 * n8 * 8 * 2048, 1978.9e12, 989.4e12) / 1e12 == pytest.approx(1738.13,
                                                                                                    abs=0.01)


def test_telemetry_counts_fp8_linears_at_the_fp8_peak():
    """The hand example of telemetry.mfu (N 1000, L 2, h 8, V 10, documents 3 and 5 in 2 rows of 8: useful
    58,368, dense 128,256 FLOPs) with 600 of the 1000 parameters in FP8 linears, P_bf16 1e5, P_fp8 2e5 FLOP/s,
    a 1 s step: useful ideal = 6·600·8/2e5 + (58,368 − 28,800)/1e5 = 0.43968 s; dense = 6·600·16/2e5 +
    (128,256 − 57,600)/1e5 = 0.99456 s."""
    from packtrain.packing.batches import build_batch
    from packtrain.telemetry.meter import ThroughputMeter
    from packtrain.train.parts import Telemetry

    batch = build_batch([np.arange(2, 5), np.arange(2, 7)], [np.array([3]), np.array([5])], budget=8)
    dims = {"n_layers": 2, "hidden_size": 8, "vocab_size": 10, "attn_width": 8, "windows": (None, None)}

    def metrics(fp8_params: int) -> dict:
        t = Telemetry(TelemetryConfig(), ThroughputMeter(0), 1e5, dims, 1000, None, fp8_params=fp8_params,
                      peak_fp8=2e5)
        return t.measure(0, [batch], 1.0, 0.0, 8, 16)

    fp8, bf16 = metrics(600), metrics(0)
    assert fp8["useful_mfu"] == pytest.approx(0.43968) and fp8["dense_mfu"] == pytest.approx(0.99456)
    assert bf16["useful_mfu"] == pytest.approx(0.58368) and bf16["dense_mfu"] == pytest.approx(1.28256)
    assert fp8["useful_tflops"] == bf16["useful_tflops"] == pytest.approx(58368 / 1e12)   # FLOPs are FLOPs


def test_planner_plans_fp8_as_bf16_without_decoder_weight_copies():
    """fp8 plans like bf16 autocast (same activations, states, backend) except the weight casts: torchao's float8
    linears save the fp32 parameter and cast on the fly, so only the LM head's bf16 copy stays."""
    from packtrain.planner.plan import plan_memory

    model = ModelConfig(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8)
    plans = {p: plan_memory(model, TrainConfig(precision=p, device="cuda", rows=4, compile=True), 1024,
                            PlanConfig(), 80.0, vocab_size=4096, device="cuda", suggest=False)
             for p in ("bf16", "fp8")}
    bf16, fp8 = plans["bf16"], plans["fp8"]
    layer_linears = 4 * (512 * 3 * 512 + 512 * 512 + 3 * 512 * 1536)   # q, k, v, o + gate, up, down per layer
    assert bf16.peak_phase == fp8.peak_phase and fp8.attention == "varlen"
    assert bf16.components["weight_casts"] - fp8.components["weight_casts"] == 2 * layer_linears
    assert bf16.phases["forward"] - fp8.phases["forward"] == 2 * layer_linears   # the LM head's copy stays
    assert {k: v for k, v in fp8.components.items() if k != "weight_casts"} == \
        {k: v for k, v in bf16.components.items() if k != "weight_casts"}
    assert fp8.precision.startswith("fp8")


@needs_torchao
def test_mix_order_reductions_stay_on_unless_turned_off():
    import torch._inductor.config as inductor_config

    before = inductor_config.triton.mix_order_reduction
    try:
        apply_fp8(tiny_llama(), Fp8Options())
        assert inductor_config.triton.mix_order_reduction is before   # the default leaves inductor as it is
        apply_fp8(tiny_llama(), Fp8Options(mix_order_reduction=False))
        assert inductor_config.triton.mix_order_reduction is False
    finally:
        inductor_config.triton.mix_order_reduction = before
