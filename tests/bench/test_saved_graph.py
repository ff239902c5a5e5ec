"""bench/saved_graph.py on a two-matmul MLP whose saved tensors are known by hand: no recompute keeps exactly what
autograd saves; caching the matrix products keeps both outputs (torch caches every kept output, needed or not) +
the input and re-runs only the ReLU; full recompute keeps the input and re-runs the first product (the replay
stops before the second, whose input is the last tensor saved). On real layers the graph's selective policy is
what torch's selective checkpoint actually caches, byte for byte, and the planner's formula."""

from __future__ import annotations

import pytest
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
    assert selective.kept_bytes == f32 * (2 * t * d + t * h) and selective.recompute_flops == 0   # x, mm1, mm2
    assert set(selective.kept) == {"input", "mm (-)"}
    full = g.policy(set())
    assert full.kept_bytes == f32 * t * d and full.recompute_flops == 2 * t * d * h
    frontier = g.frontier()
    assert [p.kept_bytes for _, p in frontier] == [f32 * t * d, f32 * (t * d + t * h)]


def _layer(lora: bool, tokens: int, r: int = 8, h: int = 128):
    from packtrain.config import ModelConfig
    from packtrain.config.train import AdapterConfig
    from packtrain.model.build import build_model
    from packtrain.model.lora import adapter_input_casts, apply_adapter, lora_layers

    torch.manual_seed(0)
    model = build_model(ModelConfig(hidden_size=h, intermediate_size=2 * h, num_layers=1, num_heads=4,
                                    num_kv_heads=2), 64)
    dtype = torch.float32
    if lora:
        apply_adapter(model, AdapterConfig(type="lora", r=r), base_dtype=torch.bfloat16)
        dtype = torch.bfloat16
    layer = model.model.layers[0]
    x = torch.randn(1, tokens, h).to(dtype).requires_grad_()
    pos = torch.arange(tokens)[None]
    cos, sin = model.model.rotary_emb(x, pos)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16), adapter_input_casts(lora_layers(model), False):
            return layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))

    return model, layer, x, (cos, sin), forward


def _graph_bytes(lora: bool, tokens: int, r: int, h: int) -> int:
    model, layer, x, shared, forward = _layer(lora, tokens, r, h)
    g = record(forward, x, shared=shared, params=list(model.parameters()), module=layer)
    return g.policy(set(g.expensive(r if lora else None))).kept_bytes


def _sac_bytes(lora: bool, tokens: int, r: int, h: int) -> int:
    """Bytes torch's selective checkpoint (train.activation_checkpointing=selective's policy) really holds after
    the forward: the tensors in its cache (a private field of the caching mode) + the region's input."""
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from packtrain.train import selective_ac

    caches = []

    def context_fn():
        caching, recompute = create_selective_checkpoint_contexts(selective_ac.policy_fn(r if lora else None))
        caches.append(caching.storage)
        return caching, recompute

    _, _, x, _, forward = _layer(lora, tokens, r, h)
    checkpoint(forward, x, use_reentrant=False, context_fn=context_fn)
    held = {}
    for per_op in caches[0].values():
        for entry in per_op.values():
            for leaf in tree_leaves(entry):
                t = getattr(leaf, "val", leaf)
                if isinstance(t, torch.Tensor):
                    held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(held.values()) + x.untyped_storage().nbytes()


@pytest.mark.parametrize("lora,r,h", [(False, 8, 128), (True, 8, 128), (True, 64, 256)])
def test_the_recorded_selective_policy_is_what_torch_caches_and_what_the_planner_counts(lora, r, h):
    """Per token (the slope between two token counts), on a dense layer under bf16 autocast (fp32 residual) and
    LoRA layers (bf16 base, input cast off; r 64 = a width the kept rule would otherwise keep): bench/saved_graph.py's
    selective policy = the bytes in torch's selective-checkpoint cache = planner.step_bytes.selective_layer_bytes_per_token
    (eager)."""
    from packtrain.config import ModelConfig
    from packtrain.planner import step_bytes as mem
    from packtrain.planner.shapes import model_shape

    shape = model_shape(ModelConfig(hidden_size=h, intermediate_size=2 * h, num_layers=1, num_heads=4,
                                    num_kv_heads=2), None, 64)
    prec = mem.Precision("lora bf16", 2, 2, False) if lora else mem.precision_of("torch", "bf16")
    graph = (_graph_bytes(lora, 128, r, h) - _graph_bytes(lora, 64, r, h)) / 64
    real = (_sac_bytes(lora, 128, r, h) - _sac_bytes(lora, 64, r, h)) / 64
    assert graph == real == mem.selective_layer_bytes_per_token(shape, prec, "sdpa"), (graph, real)


def _backward_mm_flops(lora: bool, mode: str) -> float:
    """FLOPs of the mm/addmm run during backward of one layer under checkpoint mode none / full / selective."""
    from torch.utils.checkpoint import checkpoint

    from bench.saved_graph import op_counter
    from packtrain.train.selective_ac import checkpoint_kwargs

    _, _, x, _, forward = _layer(lora, 64)
    out = forward(x) if mode == "none" else checkpoint(forward, x, use_reentrant=False, **checkpoint_kwargs(mode, 8 if lora else None))
    with op_counter() as count:
        out.float().pow(2).sum().backward()
    return count.matmul_flops()


def test_the_recorded_recompute_is_what_backward_re_runs():
    """The matrix-product FLOPs a checkpointed layer re-runs in backward, measured, = the graph's: full re-runs the
    forward up to the last saved tensor (a LoRA layer's frozen down projection included: its adapter branch saves
    after it), selective only the adapter's rank-r products."""
    for lora in (False, True):
        model, layer, x, shared, forward = _layer(lora, 64)
        g = record(forward, x, shared=shared, params=list(model.parameters()), module=layer)
        none = _backward_mm_flops(lora, "none")
        for mode, cached in (("full", set()), ("selective", set(g.expensive(8 if lora else None)))):
            expected = sum(g.ops[i].flops for i in range(g.stop) if i not in cached and g.ops[i].name == "mm")
            assert _backward_mm_flops(lora, mode) - none == expected, (lora, mode)
        down = next(i for i, o in enumerate(g.ops) if o.where == "mlp.down_proj.base_layer" or
                    o.where == "mlp.down_proj" and o.name == "mm")
        assert (down < g.stop) == lora   # the frozen down projection is re-run under full for LoRA only


def _compiled_bytes(lora: bool, tokens: int, mode: str) -> int:
    """Bytes a checkpointed layer compiled by AOTAutograd's partitioner (aot_eager_decomp_partition: inductor's
    partitioning, eager kernels) saves for backward, through saved-tensor hooks."""
    from torch.utils.checkpoint import checkpoint

    from packtrain.train.selective_ac import checkpoint_kwargs

    model, _, x, shared, forward = _layer(lora, tokens)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *shared]}
    torch._dynamo.reset()
    region = torch.compile(lambda x: checkpoint(forward, x, use_reentrant=False,
                                                **checkpoint_kwargs(mode, 8 if lora else None)),
                           backend="aot_eager_decomp_partition")
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        region(x)
    torch._dynamo.reset()
    return sum(saved.values())


@pytest.mark.parametrize("lora", [False, True])
def test_the_compiled_model_is_what_the_partitioner_saves(lora):
    """Inside torch.compile the partitioner keeps only the cached outputs backward needs (no down projection):
    SavedGraph.policy(compiled=True) = what a compiled checkpointed layer saves = the planner's compiled count."""
    from packtrain.config import ModelConfig
    from packtrain.planner import step_bytes as mem
    from packtrain.planner.shapes import model_shape

    model, layer, x, shared, forward = _layer(lora, 64)
    small = record(forward, x, shared=shared, params=list(model.parameters()), module=layer)
    model, layer, x, shared, forward = _layer(lora, 128)
    big = record(forward, x, shared=shared, params=list(model.parameters()), module=layer)
    rank = 8 if lora else None
    graph = (big.policy(set(big.expensive(rank)), compiled=True).kept_bytes
             - small.policy(set(small.expensive(rank)), compiled=True).kept_bytes) / 64
    real = (_compiled_bytes(lora, 128, "selective") - _compiled_bytes(lora, 64, "selective")) / 64
    shape = model_shape(ModelConfig(hidden_size=128, intermediate_size=256, num_layers=1, num_heads=4,
                                    num_kv_heads=2), None, 64)
    prec = mem.Precision("lora bf16", 2, 2, False) if lora else mem.precision_of("torch", "bf16")
    assert graph == real == mem.selective_layer_bytes_per_token(shape, prec, "sdpa", compiled=True), (graph, real)
