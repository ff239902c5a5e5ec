"""Loss masks on the model side, on every attention backend that runs here (CPU: sdpa, eager train; flex forward
only; CUDA adds flex training and varlen): masked tokens carry label -100, contribute exactly zero gradient,
hidden tokens after the last learned one change nothing, and a packed batch's loss is the mean of the
per-document losses over the unmasked tokens — the same number evaluation computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig
from packtrain.evaluate.perplexity import batch_loss_sum
from packtrain.model.attention import available_backends, model_inputs
from packtrain.model.build import build_model
from packtrain.packing.batches import build_batch
from packtrain.train.loss import packed_causal_lm

V = 97
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
BUDGET = 40
# (prompt, answer, trailer) lengths per document; mask 0 on prompt and trailer, 1 on the answer
ROWS = [[(5, 6, 0), (4, 3, 2), (3, 5, 0)], [(6, 8, 3), (2, 2, 0)]]
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TRAIN = [b for b in available_backends(DEV, "bf16") if b != "varlen"] + (["varlen"] if DEV == "cuda" else [])
FORWARD = sorted(set(available_backends(DEV, "fp32", training=False)) - set(TRAIN) - {"varlen"})


def _docs(seed=0, trailer_seed=None):
    """[(tokens, mask)] per row; `trailer_seed` redraws only the trailing masked tokens."""
    rng = np.random.default_rng(seed)
    trng = np.random.default_rng(trailer_seed if trailer_seed is not None else seed + 1000)
    rows = []
    for row in ROWS:
        docs = []
        for p, a, t in row:
            toks = np.concatenate([rng.integers(3, V, p + a), trng.integers(3, V, t)])
            docs.append((toks, np.array([0] * p + [1] * a + [0] * t, np.uint8)))
        rows.append(docs)
    return rows


def _batch(rows):
    return build_batch([np.concatenate([d for d, _ in r]) for r in rows],
                       [np.array([len(d) for d, _ in r]) for r in rows], BUDGET,
                       rows_masks=[np.concatenate([m for _, m in r]) for r in rows])


def _model(backend):
    torch.manual_seed(0)
    return build_model(MODEL, V, attention=backend).to(DEV)


def _amp(backend):
    return torch.autocast("cuda", dtype=torch.bfloat16) if backend == "varlen" else torch.autocast(DEV, enabled=False)


def test_masked_positions_are_labelled_minus_100():
    rows = _docs()
    b = _batch(rows)
    mask = np.concatenate([np.concatenate([np.concatenate([m for _, m in r]),
                                           np.zeros(BUDGET - sum(len(d) for d, _ in r), np.uint8)]) for r in rows])
    starts = b.cu_seqlens[:-1].long()
    labels = b.labels.reshape(-1)
    assert (labels[torch.from_numpy(mask == 0)] == -100).all()
    learned = torch.from_numpy(mask == 1).clone()
    learned[starts] = False                                   # a document's first token never has a label
    assert torch.equal(labels != -100, learned)
    assert b.n_label_tokens == int(learned.sum()) == sum(a for row in ROWS for _, a, _ in row)   # answers start ≥ 2


@pytest.mark.parametrize("backend", TRAIN)
def test_gradient_from_masked_tokens_is_exactly_zero(backend):
    """d loss / d final hidden state at every position whose target is masked is exactly 0: no term of the
    loss reads it (the LM head is per position), whatever attention did before."""
    model = _model(backend)
    b = _batch(_docs()).to(DEV)
    hidden_grad = {}

    def keep(_module, _args, out):
        out.last_hidden_state.retain_grad()
        hidden_grad["h"] = out.last_hidden_state

    handle = model.model.register_forward_hook(keep)
    try:
        with _amp(backend):
            loss = packed_causal_lm(model)(labels=b.labels, **model_inputs(b, backend))
        loss.backward()
    finally:
        handle.remove()
    g = hidden_grad["h"].grad.reshape(-1, MODEL.hidden_size)                 # (T, h)
    target = torch.cat([b.labels.reshape(-1)[1:], b.labels.new_full((1,), -100)])   # position i predicts i+1
    masked = target == -100
    assert torch.equal(g[masked], torch.zeros_like(g[masked]))                # exactly zero
    assert (g[~masked].abs().sum(-1) > 0).all()                               # every learned target has one


@pytest.mark.parametrize("backend", TRAIN)
def test_hidden_tokens_after_the_answer_change_nothing(backend):
    """Redrawing the masked trailer tokens (after each answer) leaves the loss and every gradient bitwise equal."""
    out = []
    for trailer in (1, 2):
        model = _model(backend)
        b = _batch(_docs(trailer_seed=trailer)).to(DEV)
        with _amp(backend):
            loss = packed_causal_lm(model)(labels=b.labels, **model_inputs(b, backend))
        loss.backward()
        out.append((b.input_ids.clone(), loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (ids1, l1, g1), (ids2, l2, g2) = out
    assert not torch.equal(ids1, ids2)                         # the inputs did change
    assert torch.equal(l1, l2) and all(torch.equal(a, c) for a, c in zip(g1, g2, strict=True))


@pytest.mark.parametrize("backend", TRAIN + FORWARD)
def test_packed_loss_is_the_mean_of_per_document_losses_over_unmasked_tokens(backend):
    model = _model(backend)
    rows = _docs(3)
    b = _batch(rows).to(DEV)
    module = packed_causal_lm(model)
    tol = 2e-2 if backend == "varlen" else 1e-5
    with torch.no_grad(), _amp(backend):
        packed = module(labels=b.labels, **model_inputs(b, backend)).item() / b.n_label_tokens
        sums, counts = 0.0, 0
        for r in rows:
            for d, m in r:
                alone = build_batch([d], [np.array([len(d)])], BUDGET, rows_masks=[m]).to(DEV)
                sums += module(labels=alone.labels, **model_inputs(alone, backend)).item()
                counts += alone.n_label_tokens
        evaluated, n = batch_loss_sum(model, model_inputs(b, backend), b.labels)   # the evaluate stage's sum
    assert counts == b.n_label_tokens == n
    assert abs(packed - sums / counts) <= tol * abs(packed), (backend, packed, sums / counts)
    assert abs(evaluated.item() / n - packed) <= tol * abs(packed)
