"""Selective (per-op) activation checkpointing: a layer keeps the outputs of its matrix products and its attention
and recomputes only the element-wise ops between them in backward (`train.activation_checkpointing=selective`).

    op                                         kept for backward?   why
    linear layers' mm / addmm (both widths ≥ 64)   kept             the FLOPs: recomputing them is a second forward
    fused attention (SDPA flash / efficient /      kept             quadratic FLOPs
      cuDNN, varlen, flex)
    RMSNorm, RoPE, SiLU, products, dtype casts,    recomputed       memory-bound and cheap; they are most of
      LoRA's rank-r products                                        a layer's saved bytes

A whole layer re-runs nearly no FLOPs (the rank-r products) and keeps, per token, its input plus q, k, v, the
attention output and its log-sum-exp, the o projection and the gate/up projections (planner.memory.
selective_layer_bytes_per_token). bench/suites/lora_budget.py measures the same rule on an 8B LoRA layer
(`bench/saved_graph.py` evaluates it op by op) and records what it keeps against no recompute and full recompute.

Built on torch.utils.checkpoint's `create_selective_checkpoint_contexts` (non-reentrant checkpoint, as
train.techniques wraps every mode), so torch.compile traces it like the full mode. `keeps(name, narrow)` is
the one rule; bench/saved_graph.py applies it to its recorded ops.
"""

from __future__ import annotations

from functools import partial
from typing import Any

MIN_WIDTH = 64
"""A matrix product is kept when its inner and output widths are both at least this: LoRA's r-wide products
(and other tiny ones) are recomputed, every linear layer of a real model is kept."""

MATMULS = frozenset({"mm", "addmm"})
ATTENTION = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                       "_flash_attention_forward", "_efficient_attention_forward", "_cudnn_attention_forward",
                       "_varlen_attn",
                       "flex_attention"})
"""Fused attention ops by overload-packet name (aten's SDPA kernels, torch.nn.attention.varlen's custom op,
flex attention's higher-order op). Eager attention's bmm/softmax chain is recomputed (its (s, s) scores would
be the biggest tensor of all)."""


def keeps(name: str, narrow: int = 0) -> bool:
    """Whether the selective policy keeps the output of the op `name` (its overload packet, e.g. "mm");
    `narrow`: a matrix product's smaller of its inner and output widths."""
    return name in ATTENTION or (name in MATMULS and narrow >= MIN_WIDTH)


def matmul_narrow(name: str, args: tuple) -> int:
    """The smaller of a 2-D matrix product's inner and output widths (mm(a, b) / addmm(bias, a, b)); 0 otherwise."""
    if name == "mm":
        return min(args[0].shape[1], args[1].shape[1])
    if name == "addmm":
        return min(args[1].shape[1], args[2].shape[1])
    return 0


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any):
    from torch.utils.checkpoint import CheckpointPolicy

    name = getattr(op, "__name__", "")
    packet = getattr(getattr(op, "overloadpacket", None), "__name__", name.split(".")[0])
    if keeps(packet, matmul_narrow(packet, args)):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    """The `context_fn` of torch.utils.checkpoint.checkpoint for the selective policy (a fresh pair per call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def checkpoint_kwargs(mode: str) -> dict:
    """Extra keyword arguments of torch.utils.checkpoint.checkpoint for an activation-checkpointing mode."""
    return {"context_fn": partial(selective_context_fn)} if mode == "selective" else {}
