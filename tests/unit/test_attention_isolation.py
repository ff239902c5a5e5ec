"""Isolation of documents inside a pack, on every attention backend that runs on this machine.

A document's logits inside a packed batch must equal its logits when it is alone (fp32, ≤ 1e-5). The packed
batch and the lone documents go through the same backend and `model_inputs`. CUDA-only backends (varlen, and
flex training) are covered in tests/gpu/.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig
from packtrain.errors import ConfigError
from packtrain.model.attention import available_backends, model_inputs, resolve_attention
from packtrain.model.build import build_model, count_params
from packtrain.packing.batches import build_batch

V = 97
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


def _packed(doc_lens_per_row: list[list[int]], budget: int, seed: int = 0):
    """Random documents laid out in rows; returns (batch, docs, start offset of each doc in the flat batch)."""
    rng = np.random.default_rng(seed)
    docs, starts, toks, segs = [], [], [], []
    for r, lens in enumerate(doc_lens_per_row):
        pos = r * budget
        row = [rng.integers(0, V, n) for n in lens]
        for d in row:
            docs.append(d)
            starts.append(pos)
            pos += len(d)
        toks.append(np.concatenate(row) if row else np.zeros(0, np.int64))
        segs.append(np.array(lens, np.int64))
    return build_batch(toks, segs, budget), docs, starts


def _logits(model, batch, backend) -> torch.Tensor:
    with torch.no_grad():
        return model(**model_inputs(batch, backend)).logits.reshape(-1, V)   # (T, V)


CPU_BACKENDS = [b for b in available_backends("cpu", "fp32", training=False) if b != "varlen"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_document_logits_inside_a_pack_equal_the_document_alone(backend):
    torch.manual_seed(0)
    model = build_model(MODEL, V, attention=backend).eval()
    # two rows of budget 24: [5, 9, 3 (+7 padding)] and [12, 11 (+1 padding)]; a row boundary is a document
    # boundary, padding tails are their own segments
    batch, docs, starts = _packed([[5, 9, 3], [12, 11]], budget=24)
    assert batch.input_ids.shape == (1, 48) and batch.cu_seqlens.tolist() == [0, 5, 14, 17, 24, 36, 47, 48]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # eager-mode flex warns that it is unfused
        packed = _logits(model, batch, backend)
        errs = []
        for d, s in zip(docs, starts, strict=True):
            alone = build_batch([d], [np.array([len(d)])], budget=len(d))
            errs.append((packed[s: s + len(d)] - _logits(model, alone, backend)).abs().max().item())
    assert max(errs) <= 1e-5, f"{backend}: max logit error {max(errs):.3g} per document {errs}"


def test_without_isolation_the_documents_would_leak():
    """Control: the same pack with plain causal attention (position_ids 0..T-1) changes later documents'
    logits, so the isolation test above can fail."""
    torch.manual_seed(0)
    model = build_model(MODEL, V, attention="sdpa").eval()
    batch, docs, starts = _packed([[5, 9, 3]], budget=17)
    with torch.no_grad():
        leaky = model(input_ids=batch.input_ids, use_cache=False).logits[0]
        alone = _logits(model, build_batch([docs[1]], [np.array([9])], budget=9), "sdpa")
    assert (leaky[5:14] - alone).abs().max().item() > 1e-3


def test_backends_and_auto():
    assert resolve_attention("auto", "cpu", "fp32") == "sdpa"
    assert resolve_attention("eager", "cpu", "bf16") == "eager"
    assert "varlen" not in available_backends("cpu", "bf16")
    with pytest.raises(ConfigError, match="train.attention: 'varlen' is not available on cpu"):
        resolve_attention("varlen", "cpu", "bf16")
    with pytest.raises(ConfigError, match="no FlexAttention backward on CPU"):
        resolve_attention("flex", "cpu", "fp32", training=True)
    assert resolve_attention("flex", "cpu", "fp32", training=False) == "flex"


def test_model_inputs_layouts():
    batch, _, _ = _packed([[3, 4], [8]], budget=8)
    rows = model_inputs(batch, "sdpa")
    assert rows["input_ids"].shape == (2, 8) and rows["use_cache"] is False and "attention_mask" not in rows
    assert rows["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]]
    var = model_inputs(batch, "varlen")
    assert var["input_ids"].shape == (1, 16) and var["cu_seq_lens_q"].tolist() == [0, 3, 7, 8, 16]
    assert var["cu_seq_lens_q"].dtype == torch.int32 and var["max_length_q"] == 8
    flex = model_inputs(batch, "flex")
    dense = flex["attention_mask"].to_dense()   # (1, 1, n_blocks_q, n_blocks_kv) block occupancy
    assert dense.shape[:2] == (1, 1) and flex["input_ids"].shape == (1, 16)


def test_meta_init_and_param_count():
    """Random init never materializes twice (meta → to_empty → init); sizes match the tiny-cpu table."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(), 4096)
    n = count_params(model)
    assert (n.total, n.embedding, n.non_embedding) == (362_816, 262_144, 100_672)
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied
    w = model.model.layers[0].mlp.up_proj.weight
    assert abs(w.std().item() - 0.02) < 0.002 and torch.all(model.model.norm.weight == 1)
    assert torch.isfinite(torch.cat([p.flatten() for p in model.parameters()])).all()
    inv = model.model.rotary_emb.inv_freq
    assert torch.allclose(inv, 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16)))


def test_build_from_a_pretrained_directory(tmp_path):
    torch.manual_seed(0)
    src = build_model(MODEL, V)
    src.save_pretrained(tmp_path / "m")
    cfg = MODEL.model_copy(update={"pretrained_dir": str(tmp_path / "m")})
    loaded = build_model(cfg, V, attention="flex")
    assert loaded.config._attn_implementation == "packtrain_flex" and loaded.config.use_cache is False
    for (k, a), b in zip(src.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(ConfigError, match=f"vocab_size {V} < the tokenizer's {V + 1}"):
        build_model(cfg, V + 1)
    with pytest.raises(Exception, match="no config.json"):
        build_model(MODEL.model_copy(update={"pretrained_dir": str(tmp_path)}), V)
