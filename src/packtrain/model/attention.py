"""Isolated attention backends for packed batches, plugged into transformers' attention registry.

A packed micro-batch holds several documents per row; a token may only attend to earlier tokens of its own
document (see `packtrain.packing.batches` for the mask picture). Four backends give that guarantee; each is a
name for `train.attention` and maps to a transformers `attn_implementation`:

    backend  attn_implementation  layout      how documents are isolated                      cost
    sdpa     sdpa                 (rows, L)   transformers detects packing from position_ids  O(L²) bool mask per row,
                                              (attention_mask=None, use_cache=False) and       flash kernel off
                                              builds a block-diagonal mask
    eager    eager                (rows, L)   same detection, float mask + matmul/softmax     O(L²) scores; reference
    flex     packtrain_flex       (1, T)      FlexAttention + a document BlockMask built ONCE  skips cross-document
                                              per micro-batch from segment_ids, shared by all  blocks; needs compile
                                              layers (passed as the 4-D attention_mask)         (7.9 ms/mask uncompiled)
    varlen   packtrain_varlen     (1, T)      torch.nn.attention.varlen.varlen_attn over       FlashAttention varlen,
                                              cu_seqlens, causal                               CUDA + bf16/fp16 only

`L` = pack budget, `T` = rows·L. Position ids need not start at 0 (chunks of a split document under
pack.chunk_positions=continue): varlen and flex never read them for masking, and transformers' detection starts a
new document wherever consecutive ids do not step by +1, which packtrain.packing.batches.build_batch guarantees at
every segment boundary (tests/unit/test_long_context.py, tests/gpu/test_long_context_gpu.py). Families with sliding windows or soft-caps (packtrain.model.families): sdpa/eager
get them from transformers' own masks and eager attention; flex applies a layer's window and soft-cap as a
score_mod; varlen passes window_size=(W-1, 0); what a backend cannot compute is refused at setup (families.py)
and raises in the kernel. Measured on the H200 (docs/design.md): varlen fwd+bwd over 16k packed tokens 0.91 ms
vs. SDPA flash on plain causal rows 0.82 ms; flex 0.90 ms. `auto` = varlen on CUDA (bf16/fp16) if torch has it,
else flex on CUDA, else sdpa (the only sensible choice on CPU).

`model_inputs(batch, backend)` returns the keyword arguments for `model(**kw)` (or `model.model(**kw)`):
always `use_cache=False` — transformers' default `use_cache=True` creates a KV cache that silently disables
packed-sequence detection (max logit error 0.51 measured with it, 1.5e-7 without).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from packtrain.packing.batches import PackedBatch

BACKENDS = ("sdpa", "eager", "flex", "varlen")
HF_NAMES = {"sdpa": "sdpa", "eager": "eager", "flex": "packtrain_flex", "varlen": "packtrain_varlen"}


def _device_type(device: Any) -> str:
    return str(device).split(":")[0]


@functools.cache
def _varlen_fn():
    """torch.nn.attention.varlen.varlen_attn, or None on a torch without it (< 2.9)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _flex_importable() -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def available_backends(device: Any, precision: str = "bf16", training: bool = True) -> list[str]:
    """Backends that run on `device` with `precision`. CPU: sdpa, eager, and flex for inference only (torch
    has no flex backward on CPU; eager-mode flex materializes the scores); CUDA: sdpa, eager, flex, and varlen
    for bf16/fp16/fp8 (FlashAttention has no fp32 kernel; under fp8 attention runs in bf16)."""
    out = ["sdpa", "eager"]
    if _flex_importable() and (_device_type(device) == "cuda" or not training):
        out.append("flex")
    if _device_type(device) == "cuda" and precision in ("bf16", "fp16", "fp8") and _varlen_fn() is not None:
        out.append("varlen")
    return out


def resolve_attention(name: str, device: Any, precision: str = "bf16", training: bool = True,
                      key: str = "train.attention") -> str:
    """`auto` → the fastest isolated backend on the device; an explicit name is checked (`key`: the setting named
    in errors). Knows nothing of the model: packtrain.model.families.pick_attention also honours the family.

    >>> resolve_attention("auto", "cpu", "fp32")
    'sdpa'
    """
    avail = available_backends(device, precision, training)
    if name == "auto":
        if _device_type(device) != "cuda":
            return "sdpa"
        for pick in ("varlen", "flex", "sdpa"):
            if pick in avail:
                return pick
    if name not in BACKENDS:
        raise ConfigError(f"{key}: {name!r} is not a backend (allowed: auto, {', '.join(BACKENDS)})")
    if name not in avail:
        why = ("needs CUDA, bf16/fp16/fp8 precision and torch ≥ 2.9 (torch.nn.attention.varlen)" if name == "varlen"
               else "needs CUDA for training (torch has no FlexAttention backward on CPU) and torch ≥ 2.5")
        raise ConfigError(f"{key}: {name!r} is not available on {device} with precision {precision}: "
                          f"{why}; available here: {', '.join(avail)}")
    return name


def _same_dtype(query, key, value):
    """Under autocast, RoPE leaves q/k in fp32 (q·cos with cos in the residual's fp32) while v is bf16: cast all
    three to the autocast dtype (what SDPA does itself), else to value's dtype."""
    import torch

    dev = query.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else value.dtype
    return query.to(dt), key.to(dt), value.to(dt)


# ------------------------------------------------------------------------------------------------ varlen

@functools.cache
def _varlen_kwargs() -> tuple[dict, bool]:
    """Causal flag for the installed varlen_attn: torch ≥ 2.11 takes window_size=(-1, 0) (no is_causal),
    torch 2.9/2.10 take is_causal=True. Returns (kwargs, has_enable_gqa)."""
    params = inspect.signature(_varlen_fn()).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return causal, "enable_gqa" in params


def varlen_supports_window() -> bool:
    """True when this torch's varlen_attn takes window_size (sliding-window families can run on varlen)."""
    fn = _varlen_fn()
    return fn is not None and "window_size" in inspect.signature(fn).parameters


def _repeat_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(T, H_kv, D) → (T, H_kv·n_rep, D), each kv head repeated for its group of query heads."""
    if n_rep == 1:
        return x
    t, h, d = x.shape
    return x[:, :, None, :].expand(t, h, n_rep, d).reshape(t, h * n_rep, d)


def _refuse_unsupported(backend: str, dropout: float, kwargs: dict, softcap_ok: bool) -> None:
    """Attention semantics a packtrain kernel would drop are an error, never silently ignored (families.py
    refuses these pairs at setup; this is the guard for a model loaded some other way)."""
    if dropout:
        raise ValueError(f"packtrain_{backend} attention has no dropout (got {dropout}); use sdpa/eager")
    if kwargs.get("softcap") and not softcap_ok:
        raise ValueError(f"packtrain_{backend} attention cannot soft-cap scores (softcap={kwargs['softcap']}); "
                         "use flex or eager")
    for key in ("s_aux", "sinks"):
        if kwargs.get(key) is not None:
            raise ValueError(f"packtrain_{backend} attention does not implement attention sinks ({key})")


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             cu_seq_lens_q=None, max_length_q=None, sliding_window=None, **kwargs):
    """transformers attention function: query (1, Hq, T, D), key/value (1, Hkv, T, D) → ((1, T, Hq, D), None).

    Causal attention within each [cu_seq_lens_q[i], cu_seq_lens_q[i+1]) span of the flattened T tokens; with a
    layer's `sliding_window` W, FlashAttention's window (W-1 left, 0 right): q sees kv iff 0 ≤ q - kv < W, the
    same as transformers' sliding mask (kv > q - W)."""
    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError("packtrain_varlen attention needs cu_seq_lens_q and max_length_q "
                         "(pass packtrain.model.attention.model_inputs(batch, 'varlen'))")
    if query.shape[0] != 1:
        raise ValueError(f"packtrain_varlen expects a flattened (1, T) batch, got batch size {query.shape[0]}")
    _refuse_unsupported("varlen", dropout, kwargs, softcap_ok=False)
    query, key, value = _same_dtype(query, key, value)
    q = query[0].transpose(0, 1)   # (T, Hq, D)
    k = key[0].transpose(0, 1)     # (T, Hkv, D)
    v = value[0].transpose(0, 1)
    causal, has_gqa = _varlen_kwargs()
    n_rep = q.shape[1] // k.shape[1]
    extra = dict(causal)
    if sliding_window is not None:
        if not varlen_supports_window():
            raise ValueError(f"packtrain_varlen: sliding_window={sliding_window} but this torch's varlen_attn "
                             "has no window_size argument")
        extra["window_size"] = (int(sliding_window) - 1, 0)
    if n_rep > 1:
        if has_gqa:
            extra["enable_gqa"] = True
        else:
            k, v = _repeat_heads(k, n_rep), _repeat_heads(v, n_rep)
    out = _varlen_fn()(q, k, v, cu_seq_lens_q, cu_seq_lens_q, max_length_q, max_length_q,
                       scale=scaling, **extra)   # (T, Hq, D)
    return out.unsqueeze(0), None


# ------------------------------------------------------------------------------------------------ flex

@functools.cache
def _compiled_flex():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _compiled_create_block_mask():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


@functools.cache
def _score_mod(window: int | None, softcap: float | None):
    """A flex score_mod for a layer's sliding window and soft-cap, or None for plain causal attention.

    Cached per (window, softcap): the compiled flex kernel guards on the score_mod object, so every layer of a
    kind reuses one function (a new closure per call would recompile every step). The window is applied here,
    not in the BlockMask: the document BlockMask is built once per micro-batch from segment ids alone (the
    loop's `model_inputs(batch, 'flex')` knows nothing of the model), so out-of-window blocks are computed and
    masked instead of skipped — equal results, less block sparsity when documents are longer than W."""
    if window is None and not softcap:
        return None
    import torch

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if window is not None:
            score = torch.where(q_idx - kv_idx < window, score, -float("inf"))
        return score

    return score_mod


def flex_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           sliding_window=None, **kwargs):
    """transformers attention function: (1, H, T, D) tensors + a document BlockMask → ((1, T, Hq, D), None).

    The BlockMask arrives as `attention_mask` (4-D, so transformers passes it through untouched). A layer's
    `sliding_window` and `softcap` (Gemma2) become a score_mod. On CUDA the compiled flex kernel runs; on CPU
    flex runs in eager mode (materializes scores; for tests only)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if not isinstance(attention_mask, BlockMask):
        raise ValueError("packtrain_flex attention needs a document BlockMask as attention_mask "
                         "(pass packtrain.model.attention.model_inputs(batch, 'flex'))")
    _refuse_unsupported("flex", dropout, kwargs, softcap_ok=True)
    query, key, value = _same_dtype(query, key, value)
    # compiled kernel for block-aligned lengths (every training shape: rows × budget); eager flex otherwise
    # (torch 2.11 inductor has no flex template for T=120 — measured on the H200: NoValidChoicesError)
    fn = _compiled_flex() if query.is_cuda and query.shape[2] % 128 == 0 else flex_attention
    gqa = query.shape[1] != key.shape[1]
    mod = _score_mod(None if sliding_window is None else int(sliding_window), kwargs.get("softcap") or None)
    out = fn(query, key, value, score_mod=mod, block_mask=attention_mask, scale=scaling,
             enable_gqa=gqa)   # (1, Hq, T, D)
    return out.transpose(1, 2).contiguous(), None


def document_block_mask(segment_ids: torch.Tensor):
    """BlockMask for a flattened (1, T) batch: q may see kv iff same segment and kv ≤ q.

    Built once per micro-batch (compiled on CUDA: ~0.1 ms vs 7.9 ms eager for 16k tokens) and shared by every
    layer. Fully cross-document 128×128 blocks are skipped by the kernel."""
    from torch.nn.attention.flex_attention import create_block_mask

    seg = segment_ids.reshape(-1)   # (T,)
    n = seg.numel()

    def document_causal(b, h, q_idx, kv_idx):
        return (seg[q_idx] == seg[kv_idx]) & (q_idx >= kv_idx)

    make = _compiled_create_block_mask() if seg.is_cuda else create_block_mask
    return make(document_causal, None, None, n, n, device=seg.device)


# ------------------------------------------------------------------------------------------------ wiring

_REGISTERED = False


def register_attention_backends() -> None:
    """Register packtrain_flex and packtrain_varlen with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(HF_NAMES["flex"], flex_attention_forward)
    AttentionInterface.register(HF_NAMES["varlen"], varlen_attention_forward)
    _REGISTERED = True


def model_inputs(batch: PackedBatch, backend: str, compiled: bool = False) -> dict:
    """Keyword arguments for `model(**kw)` on a packed batch (already on the model's device).

    sdpa/eager: input_ids/position_ids as (rows, budget), attention_mask None — transformers builds the
    block-diagonal mask per row. flex: (1, T) + the BlockMask. varlen: (1, T) + cu_seqlens and the budget as
    max length (an upper bound of max_seqlen that never changes, so a compiled graph is reused).
    Labels are not included: the loss is computed by packtrain.train.loss on the flattened (1, T) labels.
    """
    import torch

    if backend in ("sdpa", "eager"):
        rows = batch.as_rows()
        return {"input_ids": rows["input_ids"], "position_ids": rows["position_ids"], "use_cache": False}
    kw = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    if backend == "flex":
        kw["attention_mask"] = document_block_mask(batch.segment_ids)
    elif backend == "varlen":
        cu = batch.cu_seqlens.to(dtype=torch.int32)
        if compiled:
            torch._dynamo.maybe_mark_dynamic(cu, 0)   # n_segments varies per batch: one graph for all
        kw.update(cu_seq_lens_q=cu, max_length_q=int(batch.budget))
    else:
        raise ConfigError(f"train.attention: unknown backend {backend!r} (allowed: {', '.join(BACKENDS)})")
    return kw
