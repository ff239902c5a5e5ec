"""MFU arithmetic against hand-computed values, the peak table, overrides and the measured CPU fallback."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.telemetry import mfu


def test_step_flops_hand_computed():
    # N=1000 non-embedding params, L=2 layers, h=8, V=10; two documents of 3 and 5 tokens in 2 rows of 8.
    # per-token matmuls: 6N + 6hV = 6000 + 480 = 6480
    # useful: 6480 * (3+5) = 51840;  attention 12*L*h*(3² + 5²) = 12*2*8*34 = 6528  → 58368
    # dense:  6480 * 16    = 103680; attention 12*L*h*rows*budget² = 12*2*8*2*64 = 24576 → 128256
    useful, dense = mfu.step_flops(1000, 2, 8, [3, 5], slot_tokens=16, budget=8, vocab_size=10)
    assert useful == 58368.0
    assert dense == 128256.0


@pytest.mark.parametrize(
    "args, expected",
    [
        # no LM head term: per-token 6N = 600; one full row of 4: useful == dense = 600*4 + 12*1*4*16 = 3168
        ((100, 1, 4, [4], 4, 4, 0), (3168.0, 3168.0)),
        # empty micro-batch (all padding): useful 0, dense = 600*4 + 768 = 3168
        ((100, 1, 4, [], 4, 4, 0), (0.0, 3168.0)),
        # four 1-token docs in a row of 4: useful = 600*4 + 12*4*(1+1+1+1) = 2592
        ((100, 1, 4, [1, 1, 1, 1], 4, 4, 0), (2592.0, 3168.0)),
        # 350M-like (N=302M, L=24, h=1024, V=32000), 8 rows x 2048 filled with 32 docs of 512:
        # per token 6*302e6 + 6*1024*32000 = 2,008,608,000; x16384 = 32,909,033,472,000
        # useful attn 12*24*1024*32*512² = 2,473,901,162,496 → 35,382,934,634,496
        # dense attn 12*24*1024*8*2048² = 9,895,604,649,984; matmuls same → 42,804,638,121,984
        ((302_000_000, 24, 1024, [512] * 32, 16384, 2048, 32000), (35382934634496.0, 42804638121984.0)),
    ],
)
def test_step_flops_table(args, expected):
    assert mfu.step_flops(*args) == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=0, max_size=12), st.integers(1, 4))
def test_useful_never_exceeds_dense(lengths, rows):
    budget = 64
    # keep the documents within the micro-batch: truncate the list to what fits
    fitted, total = [], 0
    for s in lengths:
        if total + s <= rows * budget:
            fitted.append(s)
            total += s
    useful, dense = mfu.step_flops(5000, 3, 16, fitted, rows * budget, budget, vocab_size=50)
    assert 0 <= useful <= dense
    # a fully packed row of one document per row reaches dense exactly
    full_u, full_d = mfu.step_flops(5000, 3, 16, [budget] * rows, rows * budget, budget, vocab_size=50)
    assert full_u == full_d


def test_step_flops_rejects_inconsistent_sizes():
    with pytest.raises(ValueError, match="multiple of budget"):
        mfu.step_flops(10, 1, 4, [3], slot_tokens=10, budget=4)
    with pytest.raises(ValueError, match="exceeds slot_tokens"):
        mfu.step_flops(10, 1, 4, [5, 5], slot_tokens=8, budget=4)


@pytest.mark.parametrize(
    "name, precision, tflops",
    [
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200 NVL", "bf16", 835.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA A10", "bf16", 125.0),
        ("NVIDIA A10G", "bf16", 70.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100-SXM2-16GB", "bf16", 15.7),  # no bf16 tensor cores: runs as fp32
        ("NVIDIA H200", "fp32", 66.9),
    ],
)
def test_peak_table(name, precision, tflops):
    assert mfu.peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_peak_override_wins_and_is_validated():
    # the H200 measured ~790 TFLOP/s bf16 dense (docs/design.md): the config override replaces the datasheet 989.4
    assert mfu.peak_flops("NVIDIA H200", "bf16", override_tflops=790.0) == 790e12
    with pytest.raises(ValueError, match="precision"):
        mfu.peak_flops("NVIDIA H200", "int4")


def test_cpu_peak_is_measured_once():
    first = mfu.peak_flops("cpu", "fp32")
    assert first == mfu.peak_flops("cpu", "fp32")  # cached per process
    assert 1e8 < first < 1e14  # a CPU does between 0.1 GFLOP/s and 100 TFLOP/s of fp32 matmul


def test_mfu_ratio():
    # 4.28e13 FLOPs in 0.1 s against 989.4 TFLOP/s → 0.4326
    assert mfu.mfu(4.28e13, 0.1, 989.4e12) == pytest.approx(0.43258, rel=1e-4)
    assert mfu.mfu(1.0, 0.0, 1.0) == 0.0


def test_count_nonembedding_params_skips_tied_and_untied_embeddings():
    class Tiny(torch.nn.Module):
        def __init__(self, tie: bool):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)       # 400, excluded
            self.block = torch.nn.Linear(8, 8)           # 64 + 8 = 72, counted
            self.head = torch.nn.Linear(8, 50, bias=False)
            if tie:
                self.head.weight = self.embed.weight

        def get_output_embeddings(self):
            return self.head

    assert mfu.count_nonembedding_params(Tiny(tie=True)) == 72
    assert mfu.count_nonembedding_params(Tiny(tie=False)) == 72  # the untied head (400) is the 6hV term
