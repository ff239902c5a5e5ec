"""Family × backend isolation on CUDA in bf16 (skipped without CUDA): varlen (FlashAttention varlen with the
family's sliding window as window_size=(W-1, 0)) and flex (compiled, window/soft-cap as score_mod) — the pairs
tests/unit/test_family_isolation.py cannot run on CPU — plus sdpa/eager under the GPU machine's transformers.

    python -m pytest -q -s tests/gpu/test_family_varlen.py      # -s prints one JSON line per pair

Tolerance: the bf16 isolation tests' (tests/gpu/test_train_gpu.py): max error ≤ 0.05 and < 0.1 × the error of
the same rows without isolation; the semantics check compares with transformers' eager attention on the
document alone (fp32 weights, bf16 autocast), same tolerance.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

V = 1024
ROWS = [[37, 120, 64], [200, 56]]   # two rows of 256: 3 + 2 documents and 35 tokens of padding
BUDGET = 256


def _pairs():
    from packtrain.testing.tiny_families import FAMILY_NAMES

    return [(f, b) for f in FAMILY_NAMES for b in ("varlen", "flex", "sdpa", "eager")
            if not (f == "gemma2" and b in ("varlen", "sdpa"))]


def _gpu_sizes(family: str) -> dict:
    """Wider than the CPU fixtures: head_dim 32 (compiled flex needs ≥ 16; FlashAttention a multiple of 8), and a
    real model's init std 0.02: the CPU fixtures' 0.2 gives logits of ±50, where bf16 rounding alone is ~0.8
    (measured on the H200: llama sdpa vs eager, no window involved), drowning the 0.05 tolerance."""
    from packtrain.testing.tiny_families import FAMILY_KWARGS

    extra = {"head_dim": 32} if "head_dim" in FAMILY_KWARGS[family] else {}
    return dict(hidden_size=128, intermediate_size=256, max_position_embeddings=512, initializer_range=0.02, **extra)


def _logits(model, batch, backend):
    from packtrain.model.attention import model_inputs

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return model(**model_inputs(batch, backend)).logits.float().reshape(-1, V)


@pytest.mark.parametrize("family,backend", _pairs())
def test_family_isolation_bf16_cuda(tmp_path, family, backend):
    from packtrain.config import ModelConfig
    from packtrain.model.attention import available_backends
    from packtrain.model.build import build_model
    from packtrain.packing.batches import build_batch
    from packtrain.testing.tiny_families import build_tiny_family_dir

    if backend not in available_backends("cuda", "bf16"):
        pytest.skip(f"{backend} not available on this torch/GPU")
    d = build_tiny_family_dir(tmp_path / family, family, V, **_gpu_sizes(family))
    cfg = ModelConfig(init_from=str(d))
    model = build_model(cfg, V, backend, "cuda", training=False).eval()
    ref = build_model(cfg, V, "eager", "cuda", training=False).eval()
    rng = np.random.default_rng(0)
    docs = [[rng.integers(4, V, n) for n in r] for r in ROWS]
    batch = build_batch([np.concatenate(r) for r in docs], [np.array(r) for r in ROWS], BUDGET).to("cuda")
    leak_batch = build_batch([np.concatenate(r) for r in docs], [np.array([sum(r)]) for r in ROWS], BUDGET).to("cuda")
    packed, leak = _logits(model, batch, backend), _logits(model, leak_batch, backend)
    err = sem = leak_err = 0.0
    for r, row in enumerate(docs):
        start = r * BUDGET
        for dd in row:
            one = build_batch([dd], [np.array([len(dd)])], len(dd)).to("cuda")
            alone = _logits(model, one, backend)
            err = max(err, (packed[start: start + len(dd)] - alone).abs().max().item())
            sem = max(sem, (alone - _logits(ref, one, "eager")).abs().max().item())
            if start % BUDGET:
                leak_err = max(leak_err, (leak[start: start + len(dd)] - alone).abs().max().item())
            start += len(dd)
    print(json.dumps({"test": "family_isolation_bf16", "family": family, "backend": backend, "max_abs_err": err,
                      "vs_eager": sem, "leak_abs_err": leak_err}))
    assert err <= 0.05 and err < 0.1 * leak_err, (err, leak_err)
    assert sem <= 0.05, f"{family}/{backend} differs from transformers eager by {sem:.3g} (window/soft-cap dropped?)"


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma3_text"])
def test_family_trains_on_varlen_compiled(tmp_path, family):
    """A few steps through train() from a checkpoint: varlen + compile + bf16, finite losses."""
    from packtrain.config import load_run_config
    from packtrain.model.attention import available_backends
    from packtrain.testing.gpu_smoke import smoke_run
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs
    from packtrain.testing.tiny_families import build_tiny_family_dir

    if "varlen" not in available_backends("cuda", "bf16"):
        pytest.skip("varlen not available on this torch/GPU")
    d = build_tiny_family_dir(tmp_path / family, family, V, **_gpu_sizes(family))
    make_synthetic_inputs(tmp_path / "data", n_docs=400, vocab_size=V, budget=256)
    cfg = load_run_config("350m-h200", [f"model.init_from={d}", "pack.budget=256", "train.rows=4",
                                        "telemetry.interval_s=0.2"])
    r = smoke_run(cfg, tmp_path / "data" / "tokenize", tmp_path / "data" / "pack", tmp_path / "out", "varlen", 8,
                  warmup_steps=2)
    print(json.dumps({"test": "family_train_varlen", "family": family, **{k: r[k] for k in (
        "first_loss", "final_loss", "recompiles", "compiles", "real_tokens_per_s")}}))
    assert np.isfinite(r["final_loss"]) and np.isfinite(r["first_loss"])
