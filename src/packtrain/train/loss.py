"""The LM loss on packed batches: standard (full logits) or chunked (logits never fully materialized).

Position i's hidden state predicts labels[i+1] of the flattened (1, T) batch; labels carry -100 at every
segment's first token and on padding, so no term crosses a document boundary (see packing.batches).

    standard   logits (T, V) fp32 at once: T=16k, V=32k → 2 GiB, plus as much again for its gradient
    chunked    C tokens at a time under torch.utils.checkpoint: (C, V) live in forward and once more in
               backward (recomputed), e.g. C=2048 → 256 MiB; ~+1 LM-head matmul of compute (≈ 2·T·h·V FLOPs)
    fused      linear + cross-entropy in one node that computes the logits' gradient inside the forward, so
               neither full logits nor a recompute exist. train.loss_kernel picks the implementation: liger
               (Triton, CUDA; falls back to chunked with one warning where liger-kernel or CUDA is missing) or
               torch (train/fused_loss.py: full-size GEMMs over C-row chunks, one compiled element-wise
               kernel; any device)

Both return per-token losses summed in one `sum()` over the same (T,) vector, so the loss is bitwise equal in
fp32 (tested); the LM-head weight gradient is summed chunk by chunk instead of in one matmul, equal up to
summation order (≤ 4e-7 relative measured), all other gradients bitwise. `PackedCausalLM` wraps a causal LM
(any supported family) so that `forward(labels=..., **inputs)` returns the micro-batch's loss sum — the module
DeepSpeed or DDP wrap. A family with final logit soft-capping (Gemma2) gets cap·tanh(logits/cap) before the
cross-entropy in every loss mode, as its own forward does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packtrain.packing.batches import IGNORE

if TYPE_CHECKING:
    import torch


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """(…, L) unshifted labels → (N,) targets, N = numel: target[i] = labels_flat[i+1], last = -100.

    >>> import torch
    >>> next_token_targets(torch.tensor([[-100, 6, -100, 8, 9, -100]])).tolist()
    [6, -100, 8, 9, -100, -100]
    """
    import torch

    flat = labels.reshape(-1)
    return torch.cat([flat[1:], flat.new_full((1,), IGNORE)])


def softcap_logits(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma-style final logit soft-capping, cap·tanh(logits/cap) (the model's own forward does the same);
    `cap` None/0 → unchanged."""
    import torch

    return cap * torch.tanh(logits / cap) if cap else logits


def _token_losses(hidden: torch.Tensor, head, targets: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    """(n, h) hidden, LM head, (n,) targets → (n,) fp32 cross-entropies (0 where target = -100)."""
    import torch.nn.functional as F

    logits = softcap_logits(head(hidden).float(), softcap)   # (n, V)
    return F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")


def lm_loss_sum(hidden: torch.Tensor, head, labels: torch.Tensor, chunk_tokens: int | None = None,
                softcap: float | None = None) -> torch.Tensor:
    """Sum of next-token cross-entropies. hidden (…, L, h), labels (…, L) → fp32 scalar.

    `chunk_tokens` None → standard; else the LM head + CE run `chunk_tokens` rows at a time, each under
    activation checkpointing so only the (n, h) hidden slice is kept for backward."""
    import torch
    from torch.utils.checkpoint import checkpoint

    h = hidden.reshape(-1, hidden.shape[-1])   # (N, h)
    targets = next_token_targets(labels)        # (N,)
    if chunk_tokens is None or chunk_tokens >= h.shape[0]:
        return _token_losses(h, head, targets, softcap).sum()
    parts = [checkpoint(_token_losses, h[i:i + chunk_tokens], head, targets[i:i + chunk_tokens], softcap,
                        use_reentrant=False)
             for i in range(0, h.shape[0], chunk_tokens)]
    return torch.cat(parts).sum()


_FUSED_WARNED = False


def fused_loss_fn(softcap: float | None = None):
    """Liger's fused linear cross-entropy (sum over tokens, ignore -100, final logit soft-cap when given), or
    None where unavailable."""
    global _FUSED_WARNED
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception as e:  # noqa: BLE001 - an optional GPU extra; anything failing means "not here"
        if not _FUSED_WARNED:
            import warnings

            warnings.warn(f"train.loss=fused needs liger-kernel on CUDA ({type(e).__name__}: {e}); "
                          "using the chunked loss instead", stacklevel=2)
            _FUSED_WARNED = True
        return None
    if softcap:
        return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE, reduction="sum", softcap=softcap)
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE, reduction="sum")


def _module():
    import torch

    class PackedCausalLM(torch.nn.Module):
        """LlamaForCausalLM + packed loss. forward(labels, **model_inputs) → loss sum (fp32 scalar)."""

        def __init__(self, lm, loss: str = "standard", chunk_tokens: int = 2048, kernel: str = "liger"):
            super().__init__()
            self.lm = lm
            self.chunk_tokens = chunk_tokens if loss in ("chunked", "fused") else None
            # Gemma2's final_logit_softcapping (None for every other family): applied exactly as its forward does
            self.softcap = getattr(lm.config, "final_logit_softcapping", None) or None
            self.own_fused = loss == "fused" and kernel == "torch"
            self.fused = fused_loss_fn(self.softcap) if loss == "fused" and not self.own_fused else None

        def forward(self, labels, **inputs):
            hidden = self.lm.model(**inputs).last_hidden_state   # (rows, L, h) or (1, T, h)
            if self.own_fused:
                from packtrain.train.fused_loss import fused_linear_ce_sum

                return fused_linear_ce_sum(hidden.reshape(-1, hidden.shape[-1]), self.lm.lm_head.weight,
                                           next_token_targets(labels), self.chunk_tokens or 2048, self.softcap)
            if self.fused is not None and hidden.is_cuda:
                h = hidden.reshape(-1, hidden.shape[-1])         # (N, h)
                w = self.lm.lm_head.weight
                if torch.is_autocast_enabled("cuda"):            # the Triton kernel wants one dtype
                    dt = torch.get_autocast_dtype("cuda")
                    h, w = h.to(dt), w.to(dt)
                return self.fused(w, h, next_token_targets(labels)).float()
            return lm_loss_sum(hidden, self.lm.lm_head, labels, self.chunk_tokens, self.softcap)

    return PackedCausalLM


def packed_causal_lm(lm, loss: str = "standard", chunk_tokens: int = 2048, kernel: str = "liger"):
    """Wrap `lm` (its parameters are shared, state_dict keys gain the prefix 'lm.'); `kernel`: train.loss_kernel."""
    return _module()(lm, loss, chunk_tokens, kernel)
