"""bench/saved_graph.py on a two-matmul MLP whose saved tensors are known by hand: no recompute keeps exactly what
autograd saves; caching the matrix products keeps their outputs + the input and re-runs only the ReLU; full
recompute keeps the input and re-runs the first product (the second's output is needed by nothing saved)."""

from __future__ import annotations

import torch

from bench.saved_graph import record


def test_policies_of_a_two_matmul_mlp():
    torch.manual_seed(0)
    t, d, h = 8, 64, 128
    w1 = torch.randn(d, h, requires_grad=True)
    w2 = torch.randn(h, d, requires_grad=True)
    x = torch.randn(t, d, requires_grad=True)
    g = record(lambda x: torch.relu(x @ w1) @ w2, x, params=[w1, w2])
    assert [g.ops[i].name for i in g.expensive()] == ["mm", "mm"]
    assert g.forward_flops == 2 * t * d * h * 2
    f32 = 4
    none = g.policy(None)              # x (for w1's gradient) + relu's output (its own backward and w2's gradient)
    assert none.kept_bytes == f32 * (t * d + t * h) and none.recompute_flops == 0
    selective = g.policy(set(g.expensive()))
    assert selective.kept_bytes == f32 * (t * d + t * h) and selective.recompute_flops == 0   # mm1 out + x
    assert set(selective.kept) == {"input", "mm (-)"}
    full = g.policy(set())
    assert full.kept_bytes == f32 * t * d and full.recompute_flops == 2 * t * d * h
    frontier = g.frontier()
    assert [p.kept_bytes for _, p in frontier] == [f32 * t * d, f32 * (t * d + t * h)]


def _layer_graph(lora: bool, tokens: int):
    from packtrain.config import ModelConfig
    from packtrain.config.train import AdapterConfig
    from packtrain.model.adapter import adapter_input_casts, apply_adapter, lora_layers
    from packtrain.model.build import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(hidden_size=128, intermediate_size=256, num_layers=1, num_heads=4,
                                    num_kv_heads=2), 64)
    dtype = torch.float32
    if lora:
        apply_adapter(model, AdapterConfig(type="lora", r=8), base_dtype=torch.bfloat16)
        dtype = torch.bfloat16
    layer = model.model.layers[0]
    x = torch.randn(1, tokens, 128).to(dtype).requires_grad_()
    pos = torch.arange(tokens)[None]
    cos, sin = model.model.rotary_emb(x, pos)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16), adapter_input_casts(lora_layers(model), False):
            return layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))

    return record(forward, x, shared=(cos, sin), params=list(model.parameters()), module=layer)


def test_the_planners_selective_bytes_are_the_recorded_policys():
    """planner.memory.selective_layer_bytes_per_token = what the selective rule keeps, op by op, per token (the slope
    between two token counts): a dense layer under bf16 autocast (fp32 residual) and a LoRA layer (bf16 base)."""
    from packtrain.config import ModelConfig
    from packtrain.planner import memory as mem
    from packtrain.planner.shapes import model_shape

    shape = model_shape(ModelConfig(hidden_size=128, intermediate_size=256, num_layers=1, num_heads=4,
                                    num_kv_heads=2), None, 64)
    for lora, prec in ((False, mem.precision_of("torch", "bf16")), (True, mem.Precision("lora bf16", 2, 2, False))):
        small, big = (_layer_graph(lora, t) for t in (64, 128))
        per_token = (big.policy(set(big.expensive())).kept_bytes - small.policy(set(small.expensive())).kept_bytes) / 64
        assert per_token == mem.selective_layer_bytes_per_token(shape, prec, "sdpa"), (lora, per_token)
