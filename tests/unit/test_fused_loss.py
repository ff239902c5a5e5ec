"""packtrain's fused linear cross-entropy (train.loss=fused, train.loss_kernel=torch) against the standard loss:
the same sum and gradients on the CPU in fp32, every chunking, soft-cap and ignored target; the frozen-head case
computes no weight gradient; PackedCausalLM routes loss_kernel=torch to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from packtrain.train.fused_loss import fused_linear_ce_sum
from packtrain.train.loss import IGNORE, lm_loss_sum, packed_causal_lm, softcap_logits


def _reference(h, w, t, softcap=None):
    logits = softcap_logits(h @ w.t(), softcap)
    return F.cross_entropy(logits, t, ignore_index=IGNORE, reduction="sum")


def _case(n=37, hdim=16, v=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hdim, generator=g, dtype=torch.float64).float()
    w = (0.3 * torch.randn(v, hdim, generator=g)).float()
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = IGNORE                      # document starts and padding carry no loss
    return h, w, t


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 4096])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_sum_and_gradients_equal_the_standard_loss(chunk, softcap):
    h, w, t = _case()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref = _reference(h1, w1, t, softcap)
    got = fused_linear_ce_sum(h2, w2, t, chunk_tokens=chunk, softcap=softcap)
    (2.5 * ref).backward()               # a non-unit grad_output: the backward scales what the forward computed
    (2.5 * got).backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-6)


def test_ignored_rows_get_no_gradient_and_all_ignored_is_zero():
    h, w, t = _case(n=8)
    t[:] = IGNORE
    h = h.requires_grad_()
    loss = fused_linear_ce_sum(h, w, t, chunk_tokens=3)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(h.grad) == 0


def test_frozen_head_gets_no_weight_gradient():
    h, w, t = _case()
    h = h.requires_grad_()
    fused_linear_ce_sum(h, w, t, chunk_tokens=8).backward()
    assert w.grad is None and h.grad is not None and torch.count_nonzero(h.grad) > 0


def test_bf16_autocast_runs_the_matmuls_in_bf16_and_stays_close():
    h, w, t = _case(n=64, hdim=32, v=97)
    ref = _reference(h.bfloat16().float(), w.bfloat16().float(), t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fused_linear_ce_sum(h, w.clone().requires_grad_(), t, chunk_tokens=16)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)     # logits rounded to bf16, as autocast's head


def test_packed_causal_lm_with_the_torch_kernel_matches_the_standard_loss():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 61, (1, 24))
    labels = ids.clone()
    labels[0, 0] = labels[0, 10] = IGNORE
    pos = torch.cat([torch.arange(10), torch.arange(14)])[None]
    std = packed_causal_lm(model, "standard")(labels=labels, input_ids=ids, position_ids=pos)
    own = packed_causal_lm(model, "fused", chunk_tokens=7, kernel="torch")
    assert own.fused is None and own.own_fused
    got = own(labels=labels, input_ids=ids, position_ids=pos)
    torch.testing.assert_close(got, std, rtol=2e-6, atol=1e-5)
    hidden = model.model(input_ids=ids, position_ids=pos).last_hidden_state
    torch.testing.assert_close(lm_loss_sum(hidden, model.lm_head, labels), std)
