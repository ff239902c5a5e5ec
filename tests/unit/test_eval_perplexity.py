"""Held-out perplexity over packed batches equals perplexity computed one document at a time.

CPU, fp32, a tiny random-init LlamaForCausalLM (init std 1.0, so attention really mixes tokens and a
cross-document leak moves the loss by ~1%, far above the 1e-5 tolerance).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtrain.config import EvalConfig
from packtrain.evaluate.loading import load_model_dir
from packtrain.evaluate.perplexity import evaluate, evaluate_batches
from packtrain.packing.batches import build_batch
from packtrain.testing.tiny_model import build_tiny_model_dir, write_tiny_packs

TEXTS = ["def area(r):\n    return 3.14159 * r * r\n", "import os\nimport sys\nprint(sys.argv)\n",
         "The quick brown fox jumps over the lazy dog. " * 3, "class Point:\n    x: int\n    y: int\n"] * 8
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = build_tiny_model_dir(tmp_path_factory.mktemp("m") / "model", TEXTS, init_std=1.0)
    model, tok = load_model_dir(d, CPU)
    return d, model, tok


def doc_by_doc(model, docs) -> tuple[float, int]:
    """Σ next-token CE and count, each document alone through the plain HF forward (the reference)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for d in docs:
            x = torch.as_tensor(np.asarray(d, np.int64))[None]          # (1, L)
            logits = model(input_ids=x, use_cache=False).logits[0, :-1].double()
            total += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            n += len(d) - 1
    return total, n


def pack_in_order(docs, budget, rows):
    """Next-fit packs of whole documents → PackedBatches of `rows` packs (the packing room's collate)."""
    packs, cur = [], []
    for d in docs:
        if sum(map(len, cur)) + len(d) > budget:
            packs.append(cur)
            cur = []
        cur.append(d)
    packs.append(cur)
    out = []
    for i in range(0, len(packs), rows):
        grp = packs[i:i + rows]
        out.append(build_batch([np.concatenate(p) for p in grp], [np.array([len(d) for d in p]) for p in grp],
                               budget, pad_id=0))
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 48), min_size=1, max_size=24), budget=st.sampled_from([48, 64, 96]),
       rows=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_packed_loss_equals_document_at_a_time(tiny, lengths, budget, rows, seed):
    _, model, tok = tiny
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, len(tok), size=n) for n in lengths]
    sums = evaluate_batches(model, pack_in_order(docs, budget, rows), CPU)
    ref, n = doc_by_doc(model, docs)
    assert sums["n_label_tokens"] == n == sum(lengths) - len(lengths)
    assert sums["n_real_tokens"] == sum(lengths)
    if n:
        assert sums["loss_sum"] / n == pytest.approx(ref / n, rel=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["eager", "flex"])
def test_other_cpu_backends_match_too(tiny, backend):
    """The same equality through the other isolated backends that run inference on CPU (varlen is CUDA-only:
    tests/gpu). Eager flex materializes scores, so a small case."""
    model_dir, sdpa_model, tok = tiny
    model, _ = load_model_dir(model_dir, CPU, backend)
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, len(tok), size=n) for n in (30, 17, 40, 9, 25, 33, 1, 12)]
    sums = evaluate_batches(model, pack_in_order(docs, 64, 2), CPU, backend=backend)
    ref, n = doc_by_doc(sdpa_model, docs)   # same weights; the reference forward needs no packing support
    assert sums["n_label_tokens"] == n
    assert sums["loss_sum"] / n == pytest.approx(ref / n, rel=1e-5)


def test_isolation_is_what_makes_them_equal(tiny):
    """Negative control: the same batches with position_ids 0..T-1 (one long sequence) leak across documents."""
    _, model, tok = tiny
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, len(tok), size=n) for n in (30, 17, 40, 9, 25, 33)]
    batches = pack_in_order(docs, 64, 2)
    leaky = [dataclasses.replace(b, position_ids=torch.arange(b.input_ids.shape[1])[None]) for b in batches]
    ref, n = doc_by_doc(model, docs)
    good = evaluate_batches(model, batches, CPU)["loss_sum"] / n
    bad = evaluate_batches(model, leaky, CPU)["loss_sum"] / n
    assert good == pytest.approx(ref / n, rel=1e-5)
    assert abs(bad - ref / n) / (ref / n) > 1e-3


def test_evaluate_one_full_epoch_over_a_pack_store(tiny, tmp_path):
    """evaluate() over a real pack store through PackedLoader: 7 packs with rows=3 → 3 batches, the last one
    topped up with padding rows; every document counted, perplexity = exp(doc-by-doc mean)."""
    model_dir, model, tok = tiny
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, len(tok), size=int(n)) for n in rng.integers(20, 64, size=14)]
    split = write_tiny_packs(tmp_path / "packs" / "eval", docs, budget=96, pad_id=tok.eos_token_id)
    n_packs = json.loads((split / "meta.json").read_text())["n_packs"]
    cfg = EvalConfig(rows=3, prompts=["def ", "The "], sample_tokens=5)
    res = evaluate(model_dir, split, cfg, device="cpu")
    ref, n = doc_by_doc(model, docs)
    assert res.n_batches == res.n_batches_epoch == math.ceil(n_packs / 3) and res.complete
    assert res.n_segments == len(docs) and res.n_label_tokens == n
    assert res.eval_loss == pytest.approx(ref / n, rel=1e-5)
    assert res.perplexity == pytest.approx(math.exp(ref / n), rel=1e-5)
    assert res.n_slot_tokens == res.n_batches * 3 * 96 and res.budget == 96
    assert res.tokens_per_s > 0 and res.peak_memory_gib > 0 and res.memory_kind == "cpu_max_rss"
    assert [s["prompt"] for s in res.samples] == ["def ", "The "]
    assert all(1 <= s["n_new_tokens"] <= 5 and isinstance(s["completion"], str) for s in res.samples)
    # greedy → the same samples again
    again = evaluate(model_dir, split, cfg.model_copy(update={"max_batches": 1}), device="cpu")
    assert again.samples == res.samples
    assert again.n_batches == 1 and not again.complete and again.n_label_tokens < n


def test_evaluate_sees_exactly_the_held_out_split(tiny, tmp_path):
    """token store (split.npy marks held-out documents) → packing's pack_dataset → evaluate: the loss is the
    doc-by-doc loss over exactly the split=eval documents, none of the training ones."""
    from packtrain.config import PackConfig
    from packtrain.data.token_store import SPLIT_EVAL, write_token_store
    from packtrain.packing.dataset import pack_dataset

    model_dir, model, tok = tiny
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, len(tok), size=int(n)) for n in rng.integers(2, 80, size=40)]
    split = (rng.random(40) < 0.3).astype(np.uint8)
    write_token_store(tmp_path / "tokens", docs, np.arange(40) * 7 + 1, split,
                      {"vocab_size": len(tok), "eos_id": tok.eos_token_id, "pad_id": tok.eos_token_id})
    stats = pack_dataset(tmp_path / "tokens", tmp_path / "packs", PackConfig(budget=80, strategy="bfd"))
    res = evaluate(model_dir, tmp_path / "packs" / "eval", EvalConfig(rows=2, sample_tokens=2), device="cpu")
    held_out = [d for d, s in zip(docs, split, strict=True) if s == SPLIT_EVAL]
    ref, n = doc_by_doc(model, held_out)
    assert res.complete and res.n_segments == len(held_out) == stats.eval.n_docs
    assert res.n_label_tokens == n and res.eval_loss == pytest.approx(ref / n, rel=1e-5)
