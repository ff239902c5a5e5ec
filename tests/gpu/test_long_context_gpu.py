"""Long context on CUDA (skipped without it): chunks with continuing position ids stay isolated on every backend
in bf16 — varlen and compiled flex, which tests/unit/test_long_context.py cannot run on CPU — with the 32k
recipe's RoPE (θ 500,000, optionally linear scaling), and restart vs continue give the same loss under plain RoPE.

    python -m pytest -q -s tests/gpu/test_long_context_gpu.py

Tolerance as tests/gpu/test_family_varlen.py: bf16 max logit error ≤ 0.05 against the chunk alone at the same
positions, and < 0.1 × the error of the same row without isolation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

V = 1024
BUDGET = 1024
SEGS = [300, 500, 200]          # one row: a document, a chunk at offset 8192 (continue), a document; 24 padding
STARTS = [0, 8192, 0]


def _model(backend: str, scaling: dict | None):
    from packtrain.config import ModelConfig
    from packtrain.model.build import build_model

    cfg = ModelConfig.model_validate(dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                                          num_kv_heads=2, max_position_embeddings=32768, rope_theta=500000.0,
                                          rope_scaling=scaling))
    torch.manual_seed(0)
    return build_model(cfg, V, backend, "cuda").eval()


def _logits(model, batch, backend):
    from packtrain.model.attention import model_inputs

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return model(**model_inputs(batch, backend)).logits.float().reshape(-1, V)


@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 4.0}])
@pytest.mark.parametrize("backend", ["varlen", "flex", "sdpa", "eager"])
def test_continue_chunks_isolated_bf16_cuda(backend, scaling):
    from packtrain.model.attention import available_backends
    from packtrain.packing.batches import build_batch

    if backend not in available_backends("cuda", "bf16"):
        pytest.skip(f"{backend} not available on this torch/GPU")
    model = _model(backend, scaling)
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, V, n) for n in SEGS]
    batch = build_batch([np.concatenate(docs)], [np.array(SEGS)], BUDGET, rows_seg_starts=[np.array(STARTS)])
    leak_batch = build_batch([np.concatenate(docs)], [np.array([sum(SEGS)])], BUDGET)
    packed, leak = _logits(model, batch.to("cuda"), backend), _logits(model, leak_batch.to("cuda"), backend)
    err = leak_err = 0.0
    at = 0
    for d, s in zip(docs, STARTS, strict=True):
        one = build_batch([d], [np.array([len(d)])], len(d), rows_seg_starts=[np.array([s])]).to("cuda")
        alone = _logits(model, one, backend)
        err = max(err, (packed[at:at + len(d)] - alone).abs().max().item())
        if at:
            leak_err = max(leak_err, (leak[at:at + len(d)] - alone).abs().max().item())
        at += len(d)
    print(json.dumps({"backend": backend, "scaling": scaling, "max_err": err, "leak_err": leak_err}))
    assert err <= 0.05 and err < 0.1 * leak_err, (err, leak_err)


@pytest.mark.parametrize("backend", ["varlen", "flex"])
def test_restart_equals_continue_loss_bf16_cuda(backend):
    """Plain RoPE: a chunk's loss does not depend on its position offset (bf16: within 1%: cos/sin of angles up to
    8k·θ^0 are rounded differently)."""
    from packtrain.model.attention import available_backends
    from packtrain.packing.batches import build_batch, token_loss_sum

    if backend not in available_backends("cuda", "bf16"):
        pytest.skip(f"{backend} not available on this torch/GPU")
    model = _model(backend, None)
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, V, n) for n in SEGS]
    losses = []
    for starts in ([0, 0, 0], STARTS):
        b = build_batch([np.concatenate(docs)], [np.array(SEGS)], BUDGET, rows_seg_starts=[np.array(starts)])
        b = b.to("cuda")
        losses.append(float(token_loss_sum(_logits(model, b, backend)[None], b.labels)) / b.n_label_tokens)
    assert abs(losses[0] - losses[1]) / losses[0] < 0.01, losses
