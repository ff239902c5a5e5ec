"""Selective (per-op) activation checkpointing: a layer keeps the outputs of its matrix products and its attention
and recomputes only the element-wise ops between them in backward (`train.activation_checkpointing=selective`).

    op                                         kept for backward?   why
    linear layers' mm / addmm / _scaled_mm         kept             the FLOPs: recomputing them is a second forward
      (widths ≥ 64, neither the adapter's r)
    fused attention (SDPA flash / efficient /      kept             quadratic FLOPs
      cuDNN, varlen, flex)
    RMSNorm, RoPE, SiLU, products, dtype casts,    recomputed       memory-bound and cheap; they are most of
      LoRA's rank-r products                                        a layer's saved bytes

A whole layer re-runs nearly no FLOPs (the rank-r products) and keeps, per token, its input plus every kept op's output —
q, k, v, the attention output and its log-sum-exp, o, gate, up and down (torch caches every kept output, needed
or not; planner.step_bytes.selective_layer_bytes_per_token). bench/suites/lora_budget.py measures the same rule on an 8B LoRA layer
(`bench/saved_graph.py` evaluates it op by op) and records what it keeps against no recompute and full recompute.

Built on torch.utils.checkpoint's `create_selective_checkpoint_contexts` (non-reentrant checkpoint, as
train.techniques wraps every mode), so torch.compile traces it like the full mode. `keeps(name, inner, out, rank)` is
the one rule; bench/saved_graph.py applies it to its recorded ops. Out-variant and other mutating overloads
are always recomputed (a cached tensor written in place is an error in backward).
"""

from __future__ import annotations

from functools import partial
from typing import Any

MIN_WIDTH = 64
"""A matrix product is kept when its inner and output widths are both at least this and neither is the LoRA
adapter's rank (train.adapter.r): every linear layer of a real model is kept, the adapter's rank-r products (and
other tiny ones) are recomputed. Shapes alone cannot tell them apart — Qwen2-0.5B's k projection (896 → 128) has
the shape of its lora_A at r 128 — so at such an r that projection is recomputed too (cheap: it is the
smallest product of the layer)."""

MATMULS = frozenset({"mm", "addmm", "_scaled_mm"})
"""Matrix products by overload-packet name (_scaled_mm: the FP8 frozen base of train/fp8_frozen.py)."""
ATTENTION = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                       "_flash_attention_forward", "_efficient_attention_forward", "_cudnn_attention_forward",
                       "_varlen_attn", "flex_attention"})
"""Fused attention ops by overload-packet name (aten's SDPA kernels, torch.nn.attention.varlen's custom op,
flex attention's higher-order op). Eager attention's bmm/softmax chain is recomputed (its (s, s) scores would
be the biggest tensor of all). Flex attention without train.compile runs as its own compiled kernel, which the
policy does not see: it is then recomputed too."""


def keeps(name: str, inner: int = 0, out: int = 0, rank: int | None = None) -> bool:
    """Whether the selective policy keeps the output of the op `name` (its overload packet, e.g. "mm");
    `inner`, `out`: a matrix product's contracted and output widths; `rank`: the LoRA adapter's r, if any."""
    if name in ATTENTION:
        return True
    return name in MATMULS and min(inner, out) >= MIN_WIDTH and rank not in (inner, out)


def matmul_widths(name: str, args: tuple) -> tuple[int, int]:
    """(inner, output) widths of a 2-D matrix product: mm(a, b), _scaled_mm(a, b, ...), addmm(bias, a, b);
    (0, 0) for anything else."""
    if name in ("mm", "_scaled_mm"):
        return args[0].shape[1], args[1].shape[1]
    if name == "addmm":
        return args[1].shape[1], args[2].shape[1]
    return 0, 0


def _policy(ctx: Any, op: Any, *args: Any, rank: int | None = None, **kwargs: Any):
    from torch.utils.checkpoint import CheckpointPolicy

    schema = getattr(op, "_schema", None)
    if schema is not None and schema.is_mutable:   # mm.out and the like: a cached tensor must not be written
        return CheckpointPolicy.PREFER_RECOMPUTE
    name = getattr(op, "__name__", "")
    packet = getattr(getattr(op, "overloadpacket", None), "__name__", name.split(".")[0])
    if keeps(packet, *matmul_widths(packet, args), rank=rank):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def policy_fn(rank: int | None = None):
    """The policy function for create_selective_checkpoint_contexts, for a model with a LoRA adapter of `rank`."""
    def fn(ctx: Any, op: Any, *args: Any, **kwargs: Any):
        return _policy(ctx, op, *args, rank=rank, **kwargs)
    return fn


def selective_context_fn(rank: int | None = None):
    """The `context_fn` of torch.utils.checkpoint.checkpoint for the selective policy (a fresh pair per call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(policy_fn(rank))


def checkpoint_kwargs(mode: str, rank: int | None = None) -> dict:
    """Extra keyword arguments of torch.utils.checkpoint.checkpoint for an activation-checkpointing mode;
    `rank`: the model's LoRA adapter r (None without an adapter)."""
    return {"context_fn": partial(selective_context_fn, rank)} if mode == "selective" else {}
