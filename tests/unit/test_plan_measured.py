"""The planner against real transformers models on CPU: bytes autograd keeps for backward (saved-tensor
hooks, byte-exact) and the peak of a whole training step (torch profiler memory timeline)."""

from __future__ import annotations

import json
import warnings

import pytest

from packtrain.config import load_run_config
from packtrain.planner import plan_memory
from packtrain.planner import step_bytes as mem
from packtrain.planner.shapes import model_shape

V = 512


def _setup(precision: str, attention: str, ckpt: str = "none", rows: int = 2, budget: int = 128, kv=None,
           extra: tuple[str, ...] = ()):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    overrides = ["train.device=cpu", f"train.precision={precision}", f"train.attention={attention}",
                 f"train.activation_checkpointing={ckpt}", f"train.rows={rows}"]
    if kv:
        overrides += ["model.num_heads=8", f"model.num_kv_heads={kv}"]
    overrides += list(extra)
    cfg = load_run_config("tiny-cpu", overrides)
    m = cfg.model
    torch.manual_seed(0)
    lc = LlamaConfig(vocab_size=V, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                     num_key_value_heads=m.num_kv_heads or m.num_heads, max_position_embeddings=1024,
                     tie_word_embeddings=True, use_cache=False, attn_implementation=attention)
    model = LlamaForCausalLM(lc).train()
    if ckpt == "full":   # as packtrain.train.techniques.apply_activation_checkpointing: each layer's forward
        from torch.utils.checkpoint import checkpoint

        for layer in model.model.layers:
            def forward(*args, _inner=layer.forward, **kwargs):
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            layer.forward = forward
    ids = torch.randint(0, V, (rows, budget))
    # two documents per row: position ids restart → transformers builds the block-diagonal mask
    cut = budget // 3
    pos = torch.cat([torch.arange(cut), torch.arange(budget - cut)]).repeat(rows, 1)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    return cfg, model, ids, pos, autocast


@pytest.mark.parametrize("precision,attention,kv", [("bf16", "sdpa", None), ("fp32", "sdpa", None),
                                                     ("bf16", "eager", None), ("bf16", "sdpa", 2)])
def test_saved_activation_bytes_match_autograd_exactly(precision, attention, kv):
    import torch

    cfg, model, ids, pos, autocast = _setup(precision, attention, kv=kv)
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        torch.log_softmax(logits.float().view(-1, V), -1)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(n for ptr, n in saved.items() if ptr not in params)

    shape = model_shape(cfg.model, vocab_size=V)
    prec = mem.precision_of("torch", precision)
    rows, budget = ids.shape
    n = rows * budget
    per_layer = mem.layer_activation_bytes_per_token(shape, prec, attention) * n
    per_layer += mem.attention_quadratic_bytes(shape, prec, attention, rows, budget)
    head, shared = mem.head_activation_bytes_per_token(shape, prec, chunked=False)
    casts = 2 * shape.linear_params if prec.autocast else 0
    logp = 4 * n * V
    # the planner's inputs term counts 4 int64 tensors per token; this forward keeps only input_ids (8 B)
    predicted = shape.layers * per_layer + (head + shared - mem.INPUT_BYTES_PER_TOKEN + 8) * n + casts + logp
    assert measured == predicted


def _timeline_peak(model, step) -> int:
    """Peak CPU bytes of one step from the profiler's memory timeline (includes pre-existing tensors)."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".raw.json")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof.export_memory_timeline(path, device="cpu")
        sizes = json.loads(open(path).read())[1]
    finally:
        os.unlink(path)
    return max(sum(s) for s in sizes)


def test_whole_step_peak_within_5_percent():
    """bf16 autocast + full checkpointing: here the peak is the last layer's recomputation + backward."""
    import torch
    from torch.profiler import profile

    if not hasattr(profile, "export_memory_timeline"):
        pytest.skip("this torch has no profiler memory timeline")
    precision = "bf16"
    cfg, model, ids, pos, autocast = _setup(precision, "sdpa", "full", rows=4, budget=256, extra=(
        "model.hidden_size=128", "model.intermediate_size=344", "model.num_layers=3"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()                                   # Adam states exist from the second step on
    measured = _timeline_peak(model, step)
    plan = plan_memory(cfg.model, cfg.train, 256, cfg.plan, 80, vocab_size=V)
    assert plan.peak_phase == "layer backward"
    assert abs(plan.peak_allocated / measured - 1) < 0.05, (plan.peak_allocated, measured, plan.phases)
