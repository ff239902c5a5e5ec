"""packtrain's own fused linear cross-entropy (`train.loss=fused`, `train.loss_kernel=torch`): the LM head and the
cross-entropy in one autograd node that never keeps logits — plain torch matmuls plus one compiled element-wise
kernel per chunk.

    fused_linear_ce_sum(h, w, targets, chunk_tokens, softcap) -> fp32 scalar
        h (N, H) hidden states, w (V, H) the LM head's weight, targets (N,) next-token ids (-100: no loss)

How (per chunk of C = chunk_tokens rows, all inside the forward — the backward only scales by grad_output):

    logits = h_c @ wᵀ                    (C, V) in the compute dtype (bf16 under autocast): the one big matmul
    loss_c, g = ce_and_grad(logits)      ONE compiled kernel (CUDA): fp32 log-sum-exp, the target's logit, and
                                         g = softmax − onehot (× (1 − tanh²) under a soft-cap) written in bf16
    grad_h[c] = g @ w                    (C, H)
    grad_w   += gᵀ @ h_c                 accumulated in fp32 (V, H); skipped when w is frozen (LoRA)

Why not Liger's (`train.loss_kernel=liger`): Liger sizes its chunk as N / ⌈V / H⌉ rows — for Qwen2-0.5B (H 896,
V 151,936) 128-row chunks, so 128 small matmuls and 128 read-modify-writes of the whole (V, H) weight gradient
(136M elements each) per step. Here the chunk is `train.loss_chunk_tokens` rows (default 2048 → 8 chunks at
16k tokens, each (2048, 151,936) bf16 logits = 594 MiB live, twice with g); the matmuls are full-size GEMMs.
On the CPU the element-wise part runs eagerly (the same arithmetic; no C++ compiler needed).

Numerics: the loss sum equals `F.cross_entropy` on the same logits up to fp32 summation order (≤ 1e-6 relative,
tested against loss.lm_loss_sum); gradients equal autograd's up to the same order (the weight gradient is summed
in fp32 over chunks, where the standard path rounds one bf16 matmul).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packtrain.packing.batches import IGNORE

if TYPE_CHECKING:
    import torch

_COMPILED: dict[str, object] = {}


def _ce_and_grad(logits: torch.Tensor, targets: torch.Tensor, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) logits, (C,) targets → ((C,) fp32 losses, (C, V) d loss_sum / d logits in the logits' dtype).

    softcap 0: none; else logits' = cap·tanh(logits / cap) first (Gemma2), with its derivative in g."""
    import torch

    z = logits.float()
    if softcap:
        th = torch.tanh(z / softcap)
        z = softcap * th
    valid = targets != IGNORE                                        # (C,)
    safe = torch.where(valid, targets, 0)
    lse = torch.logsumexp(z, dim=-1)                                 # (C,) fp32
    target_logit = z.gather(1, safe[:, None])[:, 0]
    loss = torch.where(valid, lse - target_logit, 0.0)
    cols = torch.arange(z.shape[1], device=z.device)
    g = torch.exp(z - lse[:, None]) - (cols[None, :] == safe[:, None]).to(z.dtype)
    g = torch.where(valid[:, None], g, 0.0)
    if softcap:
        g = g * (1.0 - th * th)
    return loss, g.to(logits.dtype)


def _kernel(device_type: str):
    """The compiled `_ce_and_grad` on CUDA (one per process; shapes: the full chunk and the last one), eager
    elsewhere."""
    if device_type != "cuda":
        return _ce_and_grad
    if "cuda" not in _COMPILED:
        import torch

        _COMPILED["cuda"] = torch.compile(_ce_and_grad, dynamic=False)
    return _COMPILED["cuda"]


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (fp32) += a @ b, where a and b may be bf16: one GEMM with an fp32 output on CUDA (addmm's out_dtype),
    else a bf16 product added in fp32."""
    import torch

    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.add_((a @ b).to(acc.dtype))


def _function():
    import torch

    class FusedLinearCE(torch.autograd.Function):
        """loss_sum = Σ CE(h @ wᵀ, targets); gradients computed in the forward (module doc)."""

        @staticmethod
        def forward(ctx, h, w, targets, chunk_tokens: int, softcap: float, compute_dtype):
            # h (N, H), w (V, H) — any float dtype; the matmuls run in compute_dtype, the CE in fp32
            n = h.shape[0]
            need_w = ctx.needs_input_grad[1]
            with torch.autocast(h.device.type, enabled=False):
                hc, wc = h.to(compute_dtype), w.to(compute_dtype)
                grad_h = torch.empty_like(hc)
                grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
                loss = torch.zeros((), dtype=torch.float32, device=h.device)
                kernel = _kernel(h.device.type)
                for i in range(0, n, chunk_tokens):
                    h_c = hc[i:i + chunk_tokens]                          # (C, H)
                    logits = h_c @ wc.t()                                 # (C, V)
                    loss_c, g = kernel(logits, targets[i:i + chunk_tokens], softcap)
                    del logits
                    loss += loss_c.sum()
                    torch.mm(g, wc, out=grad_h[i:i + chunk_tokens])       # (C, H)
                    if need_w:
                        _accumulate(grad_w, g.t(), h_c)                   # (V, H) += (V, C) @ (C, H)
                    del g
            ctx.h_dtype, ctx.w_dtype = h.dtype, w.dtype
            ctx.save_for_backward(grad_h, *((grad_w,) if need_w else ()))
            return loss

        @staticmethod
        def backward(ctx, grad_out):
            saved = ctx.saved_tensors
            grad_h = (saved[0] * grad_out).to(ctx.h_dtype)    # a 0-dim fp32 factor: one rounding
            grad_w = (saved[1] * grad_out).to(ctx.w_dtype) if len(saved) > 1 else None
            return grad_h, grad_w, None, None, None, None

    return FusedLinearCE


_FN: list = []


def fused_linear_ce_sum(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 2048,
                        softcap: float | None = None) -> torch.Tensor:
    """Σ next-token cross-entropy of the logits h @ wᵀ (fp32 scalar), targets -100 ignored.

    h (N, H), w (V, H), targets (N,). The matmuls run in the autocast dtype when autocast is on for h's device,
    else in h's dtype.

    >>> import torch
    >>> h, w = torch.randn(5, 4), torch.randn(7, 4)
    >>> t = torch.tensor([1, -100, 3, 6, 0])
    >>> ref = torch.nn.functional.cross_entropy(h @ w.t(), t, reduction="sum")
    >>> bool(torch.allclose(fused_linear_ce_sum(h, w, t, chunk_tokens=2), ref))
    True
    """
    import torch

    if not _FN:
        _FN.append(_function())
    dev = h.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    return _FN[0].apply(h, w, targets, int(chunk_tokens), float(softcap or 0.0), dtype)
