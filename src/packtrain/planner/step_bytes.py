"""The byte arithmetic of one training step: activations, logits + loss, model and optimizer states.

Counted tensor by tensor from what autograd keeps for a transformers Llama layer (verified on CPU by hooking
`saved_tensors_hooks` on a real model: the per-layer count below matched byte-exactly for bf16 autocast,
pure bf16 and fp32, sdpa and eager). Notation: N = rows·budget tokens of a micro-batch, s = budget,
b = rows, h = hidden, h_kv = kv width, I = intermediate, a = heads, V = vocab, c = compute bytes
(2 bf16/fp16, 4 fp32).

Saved per layer per token (no recompute), attention without an O(s²) tensor (flash/varlen/flex):

    bf16 autocast, fp32 params    30·h + 4·h_kv + 8·I + 4·a
        4 fp32 (N, h): layer input + RMSNorm output (×2 norms)            16h
        bf16 copies of the norm outputs, one per projection (q,k,v,gate,up) 10h   (autocast casts per call)
        SDPA: q, k, v, output (bf16) + logsumexp (fp32, a per token)       4h + 4h_kv + 4a
        MLP: gate out, SiLU out, up out, product (bf16, width I)          8I
    pure c-byte params (fp32, or DeepSpeed bf16)   (8 + 6c)·h + 2c·h_kv + 4c·I + 4·a
    Korthikanti et al. (GPT, fp16, 4h GeLU MLP, dropout)   34·h + 5·a·s       (for comparison)

The O(s²) term depends on the attention backend (bytes per layer):
    sdpa   transformers materializes a (b, 1, s, s) bool block-diagonal mask for packed rows; SDPA converts
           it into a c-byte additive bias per call and keeps it for backward:       c·b·s²
    eager  fp32 softmax output + its bf16 copy:                                    (4 + 2)·b·a·s²
    flex, varlen   nothing quadratic (Korthikanti's 5·a·s/h term disappears).
Grouped-query attention under sdpa/eager repeats k and v to all heads before attention (h instead of h_kv).
Other families (packtrain.model.families) use the same count with q and the attention output h_q = heads ·
head_dim wide; their extra small tensors (Gemma's two more RMSNorms, Qwen3/Gemma3 q/k norms, q/k/v biases) are
not counted — a few h per token, under 2% of a layer.

Checkpointed layers keep only their input (4 bytes·h per token under autocast, c otherwise) and recompute one
layer at a time in backward. Logits + loss (standard): bf16 logits + fp32 copy + fp32 log-softmax in forward
(10·N·V bytes), 12·N·V bytes at the loss backward (log-softmax output, its gradient, the input gradient);
chunked loss: the same for C tokens at a time.

bf16 autocast also keeps a bf16 copy of every matmul weight (2 bytes × linear params, LM head included) from
the forward until that layer's backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packtrain.planner.shapes import ModelShape

Backend = Literal["sdpa", "eager", "flex", "varlen"]
LOSS_CHUNK_DEFAULT = 2048
INPUT_BYTES_PER_TOKEN = 32        # input_ids, position_ids, labels, shifted targets: int64 each
CUDA_WORKSPACE_BYTES = 64 << 20   # cuBLAS + cuBLASLt workspaces taken from the caching allocator


@dataclass(frozen=True)
class Precision:
    """How the step runs: `autocast` = fp32 parameters with bf16/fp16 matmuls; otherwise pure `compute` bytes."""

    name: str
    param_bytes: int     # bytes per parameter of the model the forward runs with
    compute_bytes: int   # c: bytes per activation element of matmul inputs/outputs
    autocast: bool

    @property
    def residual_bytes(self) -> int:
        """Bytes per element of the residual stream (what a checkpointed layer keeps)."""
        return 4 if self.autocast else self.compute_bytes


COMPILED_LAYER_ACTIVATION_FACTOR = 0.60
"""Saved activations of a torch.compile'd decoder layer / the eager layer's: measured on the H200 (torch 2.11,
bf16, fused loss, rows 8 × 2048): 350M 0.596 (varlen and sdpa alike), 1B 0.608 (bench/results/
train_gpu_smoke.json, scaling_1b_h200x2_run2.json). Applied only where it was measured — the torch engine
under bf16/fp16 autocast; fp32 and DeepSpeed runs keep the eager sizes (memory_plan_calibration.json)."""

COMPILED_FSDP2_LAYER_ACTIVATION_FACTOR = 0.70
"""The same ratio for FSDP2 (bf16 MixedPrecisionPolicy, no autocast) against the pure-bf16 eager layer (which
already saves 0.81× the autocast layer's bytes): 1B, varlen, fused loss, 8 × 2048, one H200, torch 2.11: 0.696
(measured steady peak 28.81 GiB; bench/results/fsdp2_bench_1b.json). One calibration point."""


def precision_of(engine: str, precision: str) -> Precision:
    """torch + bf16/fp16 → autocast over fp32 params; DeepSpeed bf16/fp16 → the module itself in 16 bit.

    fp8 (torchao float8 linears, docs/fp8.md) is planned as bf16 autocast for activations: a float8 linear saves
    its bf16 input for backward like an autocast linear. Its weight differs: torchao saves the fp32 parameter
    itself and casts it to e4m3 inside the matmul (one linear's 1 B/element copy at a time, below the planner's
    resolution), so plan_memory counts no per-layer bf16 weight copy under fp8 (the LM head, left bf16, keeps its
    copy). `python -m bench fp8` records planner vs measured for both precisions at one shape."""
    if precision == "fp32":
        return Precision("fp32", 4, 4, False)
    if engine == "fsdp2":   # MixedPrecisionPolicy: the layers compute in gathered bf16 params, no autocast
        return Precision(f"{precision} (FSDP2, bf16 params gathered + fp32 shards)", 2, 2, False)   # fp8 too
    if precision == "fp8":
        return Precision("fp8 linears + bf16 autocast (fp32 params)", 4, 2, True)
    if engine == "deepspeed":
        return Precision(f"{precision} (DeepSpeed, {precision} params + fp32 master)", 2, 2, False)
    return Precision(f"{precision} autocast (fp32 params)", 4, 2, True)


def layer_activation_bytes_per_token(shape: ModelShape, prec: Precision, backend: Backend) -> int:
    """Bytes one layer keeps for backward per token, without the O(s²) attention term (see module doc)."""
    h, i, a, q = shape.hidden, shape.intermediate, shape.heads, shape.q_hidden
    kv = q if (shape.kv_heads < shape.heads and backend in ("sdpa", "eager")) else shape.kv_hidden
    c = prec.compute_bytes
    lse = 0 if backend == "eager" else 4 * a
    # q and the attention output are h_q wide (= h except where head_dim ≠ h / heads: Qwen3, Gemma)
    if prec.autocast:
        return 16 * h + 5 * c * h + 2 * c * q + 2 * c * kv + 4 * c * i + lse
    return (8 + 4 * c) * h + 2 * c * q + 2 * c * kv + 4 * c * i + lse


def selective_layer_bytes_per_token(shape: ModelShape, prec: Precision, backend: Backend,
                                    compiled: bool = False) -> int:
    """Bytes a layer under selective checkpointing (train/selective_ac.py) keeps per token: its input (residual
    bytes) + the outputs of q, k, v, o, gate and up (c bytes each) + the attention output and its log-sum-exp
    (flash/varlen/flex/SDPA kernels; eager attention is recomputed whole and keeps nothing of its own). Eager torch
    caches every kept output, the down projection's too though backward needs none of it (+ c·h); inside
    torch.compile the partitioner keeps only what backward needs. Both equal, byte for byte, what torch keeps on
    real dense and LoRA layers: the selective checkpoint's cache (eager) and what AOTAutograd's partitioner saves
    (compiled; tests/bench/test_saved_graph.py)."""
    h, i, a, q, kv = shape.hidden, shape.intermediate, shape.heads, shape.q_hidden, shape.kv_hidden
    c = prec.compute_bytes
    attn = 0 if backend == "eager" else c * q + 4 * a
    return prec.residual_bytes * h + c * (q + 2 * kv + h + 2 * i) + attn + (0 if compiled else c * h)


def attention_quadratic_bytes(shape: ModelShape, prec: Precision, backend: Backend, rows: int, budget: int) -> int:
    """Per-layer O(s²) bytes kept for backward: sdpa's additive bias, eager's probabilities, 0 otherwise."""
    c = prec.compute_bytes
    if backend == "sdpa":
        return c * rows * budget * budget
    if backend == "eager":
        return (4 + (2 if c == 2 else 0)) * rows * shape.heads * budget * budget
    return 0


def checkpoint_mask_bytes(prec: Precision, backend: Backend, rows: int, budget: int) -> int:
    """The materialized (b, 1, s, s) mask a checkpointed layer keeps as an input until its backward:
    bool for sdpa, the embeddings' float dtype for eager (without checkpointing it dies after the forward)."""
    if backend == "sdpa":
        return rows * budget * budget
    if backend == "eager":
        return prec.param_bytes * rows * budget * budget
    return 0


def head_activation_bytes_per_token(shape: ModelShape, prec: Precision, chunked: bool) -> tuple[int, int]:
    """(head, shared) bytes per token. head: the final RMSNorm (input + output) and the LM head's input
    (freed by the loss backward); shared: rotary cos/sin, every RMSNorm's fp32 1/rms and the input ids
    (kept until the end of backward)."""
    h, c = shape.hidden, prec.compute_bytes
    if prec.autocast:
        head = 8 * h + (4 * h if chunked else c * h)   # chunked keeps the fp32 norm output as checkpoint input
    else:
        head = (4 + 2 * c) * h
    rope = 2 * shape.head_dim * prec.param_bytes       # cos, sin in the embeddings' dtype, shared by all layers
    rms = 4 * (2 * shape.layers + 1)                   # fp32 1/rms per norm
    return head, rope + rms + INPUT_BYTES_PER_TOKEN


def loss_bytes(shape: ModelShape, prec: Precision, tokens: int, chunk: int | None, kernel: str = "chunked",
               head_trains: bool = True) -> tuple[int, int]:
    """(forward, backward) bytes of logits + cross-entropy for `tokens` rows at once (or `chunk` at a time).

    standard / chunked (and Liger's fused, modelled as chunked):
      forward: c-byte logits + fp32 copy + fp32 log-softmax (fp32: the copy is the logits themselves);
      backward: log-softmax output + NLL gradient + log-softmax gradient, all fp32 (N, V).
    kernel "torch" (train.loss_kernel=torch, train/fused_loss.py): forward: one chunk's c-byte logits and its
      c-byte gradient (2·c·C·V; inductor keeps the fp32 arithmetic in registers), the (N, H) input gradient and,
      when the head trains, the fp32 (V, H) weight-gradient accumulator; backward: their scaled copies.
      Qwen2-0.5B at C = 16,384: 2 · 2 · 16,384 · 151,936 = 9.3 GiB (measured +9.4 GiB over Liger's peak)."""
    rows = tokens if chunk is None else min(chunk, tokens)
    c = prec.compute_bytes
    if kernel == "torch":
        held = c * tokens * shape.hidden + (4 * shape.vocab * shape.hidden if head_trains else 0)
        return 2 * c * rows * shape.vocab + held, held
    fwd = ((c if c < 4 else 0) + 4 + 4) * rows * shape.vocab
    bwd = 12 * rows * shape.vocab
    if chunk is not None and chunk < tokens:
        bwd += 4 * tokens * shape.hidden   # gradient w.r.t. the hidden states, filled chunk by chunk
    return fwd, bwd


def layer_backward_workspace_bytes(shape: ModelShape, prec: Precision, tokens: int) -> int:
    """Transient gradients on top of a layer's saved tensors while it runs backward: at the MLP product's
    backward the (N, I) gradients of the product, SiLU output and up projection are live while the product
    itself has been freed (net 2·c·I), plus the c-byte output gradient and the residual gradient."""
    c = prec.compute_bytes
    return tokens * (2 * c * shape.intermediate + c * shape.hidden + prec.residual_bytes * shape.hidden)


def checkpointed_layers(n_layers: int, mode: str, every_k: int, count: int = 0) -> list[int]:
    """Layers that recompute in backward (the one rule; packtrain.train.techniques applies it): none → [],
    full and selective → all, every_k → 0, k, 2k, …, count → `count` layers spread evenly, e.g. (8, count 6) → [0, 1, 2, 4, 5, 6].

    >>> checkpointed_layers(8, "count", 2, 6), checkpointed_layers(4, "count", 2, 9), checkpointed_layers(6, "every_k", 2)
    ([0, 1, 2, 4, 5, 6], [0, 1, 2, 3], [0, 2, 4])
    """
    if mode in ("full", "selective") or (mode == "count" and count >= n_layers):
        return list(range(n_layers))
    if mode == "every_k":
        return list(range(0, n_layers, every_k))
    if mode == "count":
        return sorted({i * n_layers // count for i in range(count)})
    return []
