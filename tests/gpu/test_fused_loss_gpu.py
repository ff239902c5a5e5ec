"""The fused linear cross-entropy kernels on CUDA (skipped without it): packtrain's own (train.loss_kernel=torch,
compiled element-wise part) and Liger's (when installed) against full fp32 logits of the same bf16-rounded
inputs, on a Qwen2-like head (H 896, V 151,936 → a 4k slice of it), with ignored targets, a last chunk shorter
than the others, Gemma2's soft-cap and a frozen head. `python -m pytest -q tests/gpu/test_fused_loss_gpu.py`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _case(n=3000, h=896, v=4099, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hid = torch.randn(n, h, device="cuda", generator=g).bfloat16()
    w = 0.02 * torch.randn(v, h, device="cuda", generator=g)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[::37] = -100
    return hid, w, t


def _reference(hid, w, t, softcap, trains):
    from packtrain.train.loss import softcap_logits

    h32 = hid.float().requires_grad_()
    w32 = w.bfloat16().float().requires_grad_(trains)
    loss = torch.nn.functional.cross_entropy(softcap_logits(h32 @ w32.t(), softcap), t, reduction="sum")
    loss.backward()
    return loss.detach(), h32.grad, w32.grad


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("kernel", ["torch", "liger"])
@pytest.mark.parametrize("softcap, trains", [(None, True), (30.0, True), (None, False)])
def test_fused_kernels_match_fp32_logits(kernel, softcap, trains):
    from packtrain.train.fused_loss import fused_linear_ce_sum
    from packtrain.train.loss import fused_loss_fn

    hid, w, t = _case()
    ref = _reference(hid, w, t, softcap, trains)
    h = hid.clone().requires_grad_()
    wp = w.clone().requires_grad_(trains)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if kernel == "torch":
            loss = fused_linear_ce_sum(h, wp, t, chunk_tokens=1024, softcap=softcap)   # chunks 1024, 1024, 952
        else:
            pytest.importorskip("liger_kernel")
            liger = fused_loss_fn(softcap)
            loss = liger(wp.to(torch.bfloat16), h, t).float()
    (0.5 * loss).backward()
    assert loss.dtype == torch.float32
    assert _rel(loss.detach(), ref[0]) < 1e-5
    assert _rel(h.grad, 0.5 * ref[1]) < 1e-2                 # bf16 gradient of bf16 logits
    if trains:
        assert _rel(wp.grad, 0.5 * ref[2]) < (1e-3 if kernel == "torch" else 1e-2)   # torch: fp32 accumulation
    else:
        assert wp.grad is None
