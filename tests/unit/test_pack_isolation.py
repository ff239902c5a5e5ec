"""Isolation with a real tiny random-init transformers Llama (fp32, CPU): a document inside a packed batch gets
the same logits as alone, and the token-mean loss is the same packed, padded or accumulated.

transformers isolates packed documents only with position_ids restarting per document, no attention_mask and
use_cache=False (docs/design.md); these tests pin that down for every backend we run on CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packtrain.packing.batches import PackedBatch, build_batch, token_loss_sum, token_mean_loss
from packtrain.packing.bins import pack_lengths

BUDGET, VOCAB = 24, 97
LENGTHS = [5, 9, 2, 14, 7, 1, 11, 3, 6, 10]     # 68 tokens: packs with 1-4 documents, some padding


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.integers(3, VOCAB, n)) for n in LENGTHS]


def _model(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=attn, use_cache=False)
    return LlamaForCausalLM(cfg).eval()


def _packed(docs, doc_idx: list[int], rows: int | None = None) -> tuple[PackedBatch, list[list[int]]]:
    """Pack the given documents with bfd into one batch; returns the batch and the doc order per row."""
    plan = pack_lengths(np.array([len(docs[i]) for i in doc_idx]), BUDGET, "bfd")
    packs = [[doc_idx[d] for d, _, _ in p] for p in plan.to_lists()]
    rows = rows or len(packs)
    packs += [[]] * (rows - len(packs))
    toks = [np.concatenate([docs[i].numpy() for i in p]) if p else np.zeros(0, np.int64) for p in packs]
    segs = [np.array([len(docs[i]) for i in p], np.int64) for p in packs]
    return build_batch(toks, segs, BUDGET, pad_id=0), packs


def _forward(model, batch: PackedBatch) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_each_document_alone(docs, attn):
    model = _model(attn)
    batch, packs = _packed(docs, list(range(len(docs))))
    assert batch.rows >= 3 and max(len(p) for p in packs) >= 3
    logits = _forward(model, batch)[0]                     # (T, V)
    worst = 0.0
    for r, pack in enumerate(packs):
        at = r * BUDGET
        for i in pack:
            n = len(docs[i])
            with torch.no_grad():
                alone = model(input_ids=docs[i][None], use_cache=False).logits[0]
            worst = max(worst, (logits[at: at + n] - alone).abs().max().item())
            at += n
    assert worst <= 1e-5


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_loss_is_the_token_mean_over_documents(docs, attn):
    model = _model(attn)
    batch, _ = _packed(docs, list(range(len(docs))))
    packed = token_mean_loss(token_loss_sum(_forward(model, batch), batch.labels), batch.n_label_tokens)
    sums, count = 0.0, 0
    for d in docs:
        with torch.no_grad():
            logits = model(input_ids=d[None], use_cache=False).logits
        sums += torch.nn.functional.cross_entropy(logits[0, :-1], d[1:], reduction="sum").item()
        count += len(d) - 1
    assert batch.n_label_tokens == count
    assert abs(packed.item() - sums / count) <= 1e-5


def test_token_mean_is_identical_packed_padded_and_accumulated(docs):
    model = _model("sdpa")
    every = list(range(len(docs)))
    # packed, one micro-batch
    batch, _ = _packed(docs, every)
    one = token_mean_loss(token_loss_sum(_forward(model, batch), batch.labels), batch.n_label_tokens)
    # packed, accumulated over 3 micro-batches of different sizes (same fixed rows each)
    groups = [every[:3], every[3:7], every[7:]]
    micro = [_packed(docs, g, rows=3)[0] for g in groups]
    window = sum(b.n_label_tokens for b in micro)
    acc = sum(token_mean_loss(token_loss_sum(_forward(model, b), b.labels), window) for b in micro)
    # padded: one document per row, right padding, attention_mask, labels -100 on padding
    S = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), S, dtype=torch.long)
    mask = torch.zeros(len(docs), S, dtype=torch.long)
    labels = torch.full((len(docs), S), -100)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)], labels[i, : len(d)] = d, 1, d
    labels[:, 0] = -100
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    padded = token_mean_loss(token_loss_sum(logits, labels), int((labels[:, 1:] != -100).sum()))
    assert window == batch.n_label_tokens
    assert abs(one.item() - acc.item()) <= 1e-5
    assert abs(one.item() - padded.item()) <= 1e-5
    # the per-micro-batch mean (what a naive loop does) is NOT invariant
    naive = sum(token_mean_loss(token_loss_sum(_forward(model, b), b.labels), b.n_label_tokens) for b in micro)
    assert abs(naive.item() / len(micro) - one.item()) > 1e-4


def test_default_use_cache_breaks_isolation(docs):
    """Why the loader's consumers must pass use_cache=False (measured: error ≫ 1e-5 with the cache on)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=64, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    batch, packs = _packed(docs, list(range(len(docs))))
    with torch.no_grad():
        cached = model(input_ids=batch.input_ids, position_ids=batch.position_ids).logits[0]
        isolated = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits[0]
    assert (cached - isolated).abs().max().item() > 1e-3
