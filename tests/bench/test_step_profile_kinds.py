"""bench/suites/step_profile.py: which kind a kernel's time counts as. By name (the names recorded on the H200, and
the names of the kernels packtrain's and Liger's losses launch), and by where it ran: a real CPU profile of
packtrain's fused loss puts its matmuls in "head" and leaves a matmul outside it in "gemm"."""

from __future__ import annotations

import time

import pytest

from bench.suites.step_profile import kind_of, summarize

# packtrain.train.fused_loss._ce_and_grad compiled by inductor (names from its ops: cpp_ on the CPU, as compiled
# here with torch 2.13; triton_red_ is the same kernel's CUDA name form)
OWN_LOSS = "_fused__to_copy_arange_eq_exp_gather_logsumexp_ne_scalar_tensor_select_sub_unsqueeze_where_0"


@pytest.mark.parametrize("name,in_head_loss,kind", [
    ("triton_red" + OWN_LOSS, False, "loss"),
    ("cpp" + OWN_LOSS, False, "loss"),
    ("triton_red_fused__to_copy_arange_div_eq_exp_gather_logsumexp_mul_ne_rsub_tanh_where_0", False, "loss"),  # softcap
    ("liger_cross_entropy_kernel", False, "loss"),
    ("element_mul_kernel", False, "loss"),   # Liger's gradient scaling
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
     "namespace)::LogSoftMaxForwardEpilogue>(float*, float", False, "loss"),   # the chunked loss
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", False, "gemm"),
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", True, "head"),
    ("aten::mm", True, "head"),
    ("aten::addmm_", True, "head"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
     True, "loss"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
     False, "copy"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128", False,
     "attention"),
    ("triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_2", False, "fused"),
    # inductor's fused RMSNorm (step_profile_qwen2_0.5b_h100.json, where it was still counted as copy)
    ("triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_9", False, "norm"),
    ("triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3", False, "norm"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::FusedOptimizerTensorListMetadata<4>", False, "optimizer"),
])
def test_kind_of_a_kernel_name(name, in_head_loss, kind):
    assert kind_of(name, in_head_loss=in_head_loss) == kind


def test_the_fused_loss_matmuls_are_the_head_and_a_matmul_outside_it_is_not():
    import torch

    from packtrain.train.fused_loss import fused_linear_ce_sum

    torch.manual_seed(0)
    h, w = torch.randn(256, 64, requires_grad=True), torch.randn(1000, 64, requires_grad=True)
    targets, layer = torch.randint(0, 1000, (256,)), torch.nn.Linear(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fused_linear_ce_sum(layer(h), w, targets, chunk_tokens=128).backward()
        wall = time.perf_counter() - t0
    out = summarize(prof, wall, 1, cuda=False, top=200)
    kinds = {(t["name"], t["kind"]) for t in out["top"]}
    # two chunks: logits = h_c @ wᵀ and grad_h = g @ w (aten::mm), grad_w += gᵀ @ h_c (aten::addmm_)
    assert {("aten::mm", "head"), ("aten::addmm_", "head"), ("aten::addmm", "gemm")} <= kinds
    assert ("aten::addmm", "head") not in kinds   # the layer's forward ran before the loss
    assert ("aten::logsumexp", "loss") in kinds and out["device_ms_by_kind"]["head"] > 0
    heads = [t for t in out["top"] if t["kind"] == "head"]
    assert sum(t["calls_per_step"] for t in heads if t["name"] == "aten::mm") == 4
