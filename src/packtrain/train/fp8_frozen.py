"""FP8 matmuls on LoRA's frozen base (`train.precision=fp8`, `train.adapter.type=lora`, `train.fp8.lora_base=static`):
the base weights never change, so they are quantized to float8 e4m3 ONCE, and each base linear runs

    forward         y  = x @ Wᵀ     torch._scaled_mm(x e4m3, W e4m3)   x cast with one dynamic scale (its amax)
    input gradient  dx = dy @ W     torch._scaled_mm(dy e5m2, W e4m3)  W transposed per call (transient, 1 B/param)
    weight gradient none            (frozen: torchao's Float8Linear still computes it, then drops it)

against torchao's path (`lora_base=torchao`), which casts the bf16 weight to e4m3 on every call and runs the
weight-gradient matmul for nothing: one FP8 GEMM in three saved, no weight casts, and the base takes 1 byte a
parameter on the GPU instead of 2 — 8 GB freed on a Llama-3-8B shape, room for fewer recomputed layers.

Quantization (tensorwise, like torchao's default recipe): scale = 448 / amax(|W|), W8 = e4m3(W · scale); the
matmul multiplies back by 1/scale in fp32 inside `_scaled_mm`. e4m3 keeps 3 mantissa bits: each weight is within
2⁻⁴ of its value (relative), the same error torchao's per-call cast makes; the product's relative Frobenius error
on random inputs is ~3% (tests/unit/test_fp8_frozen.py). The base the adapter trains against is therefore the
quantized base, as in QLoRA; the saved adapter is applied to the original weights.

What stays the same: the module's `state_dict` still holds `weight` (and `bias`) as the original dtype and values —
kept on the CPU, not the GPU — so checkpoints, merges and exports see the unquantized base; loading a state_dict
re-quantizes. Shapes need K and N multiples of 16 (fp8.ALIGN); M is padded to 16 inside the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_FN: list = []


def _quantize(t: torch.Tensor, dtype, fmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """t → (t·s cast to `dtype`, 1/s) with s = fmax / amax(|t|) (fp32 scalar; amax 0 → s 1)."""
    import torch

    amax = t.abs().amax().float()
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    q = (t.float() * scale).clamp(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def _pad16(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    import torch

    m = t.shape[0]
    pad = (-m) % 16
    return (torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t), m


def _function():
    import torch

    class Fp8FrozenMatmul(torch.autograd.Function):
        """y = x @ Wᵀ with W frozen in e4m3; gradient for x only (module doc)."""

        @staticmethod
        def forward(ctx, x, w8, w_inv):
            # x (M, K) any float dtype; w8 (N, K) e4m3; w_inv fp32 scalar
            xp, m = _pad16(x.to(torch.bfloat16))
            x8, x_inv = _quantize(xp, torch.float8_e4m3fn, E4M3_MAX)
            y = torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=torch.bfloat16)
            ctx.save_for_backward(w8, w_inv)
            ctx.x_dtype = x.dtype
            return y[:m]

        @staticmethod
        def backward(ctx, dy):
            w8, w_inv = ctx.saved_tensors
            dyp, m = _pad16(dy.to(torch.bfloat16))
            dy8, dy_inv = _quantize(dyp, torch.float8_e5m2, E5M2_MAX)
            w8t = w8.t().contiguous()                                   # (K, N): the K-major operand of dy @ W
            dx = torch._scaled_mm(dy8, w8t.t(), scale_a=dy_inv, scale_b=w_inv, out_dtype=torch.bfloat16)
            return dx[:m].to(ctx.x_dtype), None, None

    return Fp8FrozenMatmul


def _module():
    import torch

    class Fp8FrozenLinear(torch.nn.Module):
        """A frozen nn.Linear whose weight lives on the device as e4m3 (module doc); state_dict unchanged."""

        def __init__(self, linear: torch.nn.Linear):
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            w = linear.weight.detach()
            self.register_buffer("weight_fp8", torch.empty(0, dtype=torch.float8_e4m3fn, device=w.device),
                                 persistent=False)
            self.register_buffer("weight_inv_scale", torch.ones((), device=w.device), persistent=False)
            self.bias = linear.bias
            if self.bias is not None:
                self.bias.requires_grad_(False)
            self._set_weight(w)
            self._register_state_dict_hook(Fp8FrozenLinear._save_original)
            self._register_load_state_dict_pre_hook(self._load_original)

        def _set_weight(self, w: torch.Tensor) -> None:
            device: torch.device = self.get_buffer("weight_fp8").device
            q, inv = _quantize(w.to(device), torch.float8_e4m3fn, E4M3_MAX)
            self.weight_fp8, self.weight_inv_scale = q, inv
            self.original = w.to("cpu", copy=True)      # what state_dict, merges and exports read

        @staticmethod
        def _save_original(module, state_dict, prefix, local_metadata):
            state_dict[prefix + "weight"] = module.original
            return state_dict

        def _load_original(self, state_dict, prefix, *args, **kwargs):
            key = prefix + "weight"
            if key in state_dict:
                self._set_weight(state_dict.pop(key).detach())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            y = _FN[0].apply(x.reshape(-1, shape[-1]), self.weight_fp8, self.weight_inv_scale)   # bf16
            dev = x.device.type
            want = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype   # as nn.Linear
            if y.dtype != want:
                y = y.to(want)
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
            return y.reshape(*shape[:-1], self.out_features)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 frozen"

    return Fp8FrozenLinear


def fp8_frozen_linear(linear):
    """An `Fp8FrozenLinear` from a frozen nn.Linear (its weight quantized once; the original kept on the CPU)."""
    if not _FN:   # the autograd.Function is made here, never inside forward: a class body dynamo cannot trace
        _FN.append(_function())   # (it graph-broke every compiled layer: 7.1k tok/s instead of 12.4k at 8B)
    return _module()(linear)


def apply_fp8_frozen_base(model, keep) -> list[str]:
    """Replace every frozen nn.Linear that `keep(module, fqn)` accepts (fp8.fp8_linear_filter: a 16-aligned
    decoder linear, not a LoRA adapter) by an Fp8FrozenLinear, in place; returns their names in module order.
    Linears with a trainable weight are left alone."""
    import torch

    names = []
    for fqn, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and not mod.weight.requires_grad and keep(mod, fqn):
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, fp8_frozen_linear(mod))
            names.append(fqn)
    if names:   # the bf16 weights just moved to the CPU: give their device memory back
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return names
