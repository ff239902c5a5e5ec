"""Memory and throughput techniques, each a function applied to a model or an optimizer step.

    apply_activation_checkpointing(model, cfg)   none | full | every_k | count decoder layers recomputed in
                                                 backward, or selective: every layer per op (train/selective_ac.py)
    apply_compile(model, cfg) -> CompileCounter  torch.compile per decoder layer; counts (re)compiles
    guard_failure_reasons(seen)                  dynamo's reasons for the recompiles since the last call
    set_allocator_env(cfg)                       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA init
    autocast(precision, device)                  bf16 / fp16 autocast (fp8: bf16), or nothing for fp32
    make_grad_scaler(precision, device)          GradScaler for fp16 (None otherwise)
    build_optimizer(model, cfg, device)          AdamW (fused on CUDA), decay on ≥2-D weights only
    build_scheduler(optimizer, cfg)              linear warmup + cosine to min_lr_ratio·lr

Order (as in torchtitan's parallelize): activation checkpointing first, then compile, then sharding
(DeepSpeed/DDP). AC wraps each layer's forward in torch.utils.checkpoint, and compiling afterwards lets
dynamo trace the checkpoint region as one higher-order op (recompute fused with the layer); compiling first
would hide the layer's forward behind a compiled frame that AC cannot re-enter. Sharding comes last because
ZeRO-3/FSDP replace parameters with flat shards that both earlier steps must already see through the module
calls they wrapped.

Memory effect (Korthikanti et al.): activations per layer ≈ s·b·h·(34 + 5·a·s/h) bytes; full checkpointing
keeps only each layer's input (2·s·b·h bytes in bf16) and recomputes the rest (+~33% compute);
every_k with k=2 checkpoints half the layers (half the savings, +~17% compute).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from packtrain.config import TrainConfig


def decoder_layers(model) -> list:
    """The decoder layers of a LlamaForCausalLM (model.model.layers) or of its inner LlamaModel."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder layers at .model.layers")
    return list(layers)


def checkpointed_layer_indices(n_layers: int, mode: str, every_k: int = 2, count: int = 16) -> list[int]:
    """Which layers recompute their activations in backward (the rule: planner.step_bytes.checkpointed_layers).

    >>> checkpointed_layer_indices(6, "every_k", 2), checkpointed_layer_indices(3, "full")
    ([0, 2, 4], [0, 1, 2])
    """
    from packtrain.planner.step_bytes import checkpointed_layers

    if mode not in ("none", "full", "every_k", "count", "selective"):
        raise ConfigError(f"train.activation_checkpointing: {mode!r} (allowed: none, full, every_k, count, "
                          "selective)")
    return checkpointed_layers(n_layers, mode, every_k, count)


def apply_activation_checkpointing(model, cfg: TrainConfig) -> list[int]:
    """Wrap the chosen decoder layers' forward in `torch.utils.checkpoint(use_reentrant=False)`.

    The module tree and state_dict keys do not change (only the instance's `forward` is replaced), so
    checkpoints and `save_pretrained` are unaffected. Returns the wrapped layer indices."""
    from torch.utils.checkpoint import checkpoint

    from packtrain.train.selective_ac import checkpoint_kwargs

    layers = decoder_layers(model)
    idx = checkpointed_layer_indices(len(layers), cfg.activation_checkpointing, cfg.ac_every_k, cfg.ac_count)
    rank = cfg.adapter.r if cfg.adapter.type == "lora" else None
    extra = checkpoint_kwargs(cfg.activation_checkpointing, rank)   # selective: the per-op policy's context_fn
    for i in idx:
        layer = layers[i]
        if getattr(layer, "_packtrain_ac", False):
            continue
        inner = layer.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        layer.forward = forward
        layer._packtrain_ac = True
    return idx


@dataclass
class CompileCounter:
    """Counts dynamo compilations while active. compile_id 'F/N': frame F's N-th compile; N > 0 is a
    recompile (a guard failed: new shape, dtype, ...). With a fixed token budget a run should show one
    compile per distinct frame and 0 recompiles (open-instruct's variable shapes: 396)."""

    ids: list[str] = field(default_factory=list)
    _cb: Any = None

    def start(self) -> CompileCounter:
        import torch._dynamo.callback as cb

        def on_start(*args):   # torch ≥ 2.6 passes CallbackArgs(trigger, compile_id); older: nothing
            self.ids.append(str(getattr(args[0], "compile_id", "?")) if args else "?")

        self._cb = on_start
        cb.callback_handler.register_start_callback(on_start)
        return self

    def stop(self) -> None:
        if self._cb is not None:
            import torch._dynamo.callback as cb

            with contextlib.suppress(ValueError):
                cb.callback_handler.remove_start_callback(self._cb)
            self._cb = None

    @property
    def compiles(self) -> int:
        return len(self.ids)

    @property
    def recompiles(self) -> int:
        n = 0
        for cid in self.ids:
            tail = cid.rsplit("/", 1)[-1]
            n += tail.isdigit() and int(tail) > 0
        return n


def guard_failure_reasons(seen: dict[Any, int]) -> list[str]:
    """dynamo's guard-failure reasons recorded since the last call ('forward (modeling_llama.py:261): tensor
    'hidden_states' size mismatch at index 1. expected 512, actual 256'); [] when torch has none to give."""
    try:
        from torch._dynamo.utils import guard_failures
    except Exception:
        return []
    out = []
    for code, reasons in list(guard_failures.items()):
        n = seen.get(code, 0)
        if len(reasons) > n:
            where = f"{getattr(code, 'co_name', '?')} ({os.path.basename(getattr(code, 'co_filename', '?'))}:" \
                    f"{getattr(code, 'co_firstlineno', '?')})"
            out += [f"{where}: {str(r).strip()}" for r in reasons[n:]]
            seen[code] = len(reasons)
    return out


def apply_compile(model, cfg: TrainConfig, backend: str | None = None) -> CompileCounter | None:
    """`torch.compile` each decoder layer in place (`layer.compile()`, state_dict keys unchanged).

    Per-layer compile: one graph serves every layer (identical code; parameters are graph inputs), compiles
    in seconds instead of minutes, and the loss/LM head stay eager. `backend`: None → cfg.compile_backend.
    Returns a started CompileCounter (None when cfg.compile is False)."""
    if not cfg.compile:
        return None
    _share_one_layer_graph(model)
    counter = CompileCounter().start()
    for layer in decoder_layers(model):
        layer.compile(backend=backend or cfg.compile_backend)
    return counter


def _share_one_layer_graph(model) -> None:
    """A frozen input embedding with trainable layers (LoRA) feeds layer 0 a hidden state without
    requires_grad while every later layer's input has it: dynamo guards on that flag, so layer 0 would get a
    graph of its own and layer 1 a recompile. Marking the embedding output as requiring grad keeps one graph for
    all layers (cost: layer 0 also computes its input gradient, ~1/L of the backward's input-gradient work)."""
    import torch

    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    params = list(model.parameters())
    if emb is None or emb.weight.requires_grad or not any(p.requires_grad for p in params):
        return
    if getattr(emb, "_packtrain_grad_hook", False):
        return

    def require_grad(module, args, out):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            return out.requires_grad_(True)
        return out

    emb.register_forward_hook(require_grad)
    emb._packtrain_grad_hook = True


def set_allocator_env(cfg: TrainConfig) -> bool:
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the user set it; True if it is in effect.

    Must run before CUDA initializes (the allocator reads it once): expandable segments grow one mapping
    instead of caching many fixed blocks, so changing sizes do not fragment memory."""
    if not cfg.expandable_segments:
        return False
    key = "PYTORCH_CUDA_ALLOC_CONF"
    cur = os.environ.get(key, "")
    if "expandable_segments" in cur:
        return "expandable_segments:True" in cur
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        warnings.warn("CUDA was initialized before set_allocator_env: expandable_segments not applied",
                      stacklevel=2)
        return False
    os.environ[key] = f"{cur},expandable_segments:True" if cur else "expandable_segments:True"
    return True


_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}
"""fp8 autocasts to bf16: only the decoder's converted linears run FP8 matmuls (train/fp8.py), everything else is
bf16 — so fp8 also needs no GradScaler and holds a frozen LoRA base in bf16."""


def autocast(precision: str, device_type: str):
    """Autocast context for bf16/fp16/fp8 (matmuls in half precision — fp8: bf16 outside the Float8Linear layers —
    fp32 master weights); fp32: no-op."""
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in _DTYPES:
        raise ConfigError(f"train.precision: {precision!r} (allowed: fp32, bf16, fp16, fp8)")
    return torch.autocast(device_type=device_type, dtype=getattr(torch, _DTYPES[precision]))


def half_dtype(precision: str):
    """The autocast dtype of bf16/fp16/fp8 (torch.bfloat16 / torch.float16 / torch.bfloat16), None for fp32: what a
    frozen LoRA base is held in."""
    if precision not in _DTYPES:
        return None
    import torch

    return getattr(torch, _DTYPES[precision])


def make_grad_scaler(precision: str, device_type: str):
    """fp16 needs loss scaling (its range ends at 65504; small grads underflow); bf16/fp32 do not."""
    if precision != "fp16":
        return None
    import torch

    return torch.amp.GradScaler(device_type)


def build_optimizer(model, cfg: TrainConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay only on ≥2-D tensors (not norms, not biases).

    Fused (one kernel for all parameters) on CUDA when cfg.fused_optimizer; foreach on CPU."""
    import torch

    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = cfg.fused_optimizer and device_type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused or None)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup over `warmup` steps, then
    cosine from 1 to `min_ratio` at `total`.

    >>> [round(lr_factor(s, 2, 6, 0.1), 3) for s in range(7)]
    [0.5, 1.0, 1.0, 0.868, 0.55, 0.232, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer, cfg: TrainConfig):
    """LambdaLR over `lr_factor`; its state_dict is plain numbers (JSON-able) for checkpoints."""
    import torch

    warmup, total, min_ratio = cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio

    def factor(step: int) -> float:
        return lr_factor(step, warmup, total, min_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
