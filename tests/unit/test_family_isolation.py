"""Every supported family × every CPU attention backend: a document's logits inside a packed batch equal the
document alone (fp32, ≤ 1e-5), AND equal transformers' eager attention on the document alone (so a backend
that dropped the family's sliding window or soft-cap would fail here, not only isolation). Pairs that cannot
be honoured are refused with a message naming family, backend and why (one test per refused pair).

Checkpoints are tiny random-weight save_pretrained directories (packtrain.testing.tiny_families): sliding window 4 on the
families that have one, Gemma2's soft-caps at 2/3, so every quirk changes the logits of the test documents
(checked by the controls below). varlen runs on CUDA only: tests/gpu/test_family_varlen.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig
from packtrain.errors import ConfigError
from packtrain.model.attention import model_inputs
from packtrain.model.build import build_model
from packtrain.model.families import FAMILIES, attention_semantics, check_attention, refusal
from packtrain.packing.batches import build_batch
from packtrain.testing.tiny_families import (
    FAMILY_NAMES,
    build_tiny_family_dir,
    tiny_family_config,
    tiny_family_model,
)

V = 97
CPU_BACKENDS = ("sdpa", "eager", "flex")
REFUSED_ON_CPU = {("gemma2", "sdpa")}
ROWS = [[5, 9, 3], [12, 11]]     # two rows of budget 24: 3 + 2 documents, padding tails; all but one > window 4
BUDGET = 24


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_tiny_family_dir(root / f, f, vocab_size=V) for f in FAMILY_NAMES}


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(0)
    out, starts, toks = [], [], []
    for r, lens in enumerate(ROWS):
        pos, row = r * BUDGET, [rng.integers(4, V, n) for n in lens]
        for d in row:
            out.append(d)
            starts.append(pos)
            pos += len(d)
        toks.append(np.concatenate(row))
    batch = build_batch(toks, [np.array(lens) for lens in ROWS], BUDGET)
    return batch, out, starts


def _logits(model, batch, backend) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # eager-mode flex warns that it is unfused
        return model(**model_inputs(batch, backend)).logits.reshape(-1, V)   # (T, V)


def _alone(model, d, backend) -> torch.Tensor:
    return _logits(model, build_batch([d], [np.array([len(d)])], budget=len(d)), backend)


def _load(family_dirs, family, backend):
    torch.manual_seed(0)
    return build_model(ModelConfig(init_from=str(family_dirs[family])), V, attention=backend, training=False).eval()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_document_inside_a_pack_equals_alone(family_dirs, docs, family, backend):
    if (family, backend) in REFUSED_ON_CPU:
        pytest.skip("refused pair: see test_family_refused_pairs")
    batch, ds, starts = docs
    model = _load(family_dirs, family, backend)
    reference = _load(family_dirs, family, "eager")          # transformers' own attention for the family
    packed = _logits(model, batch, backend)
    iso, sem = [], []
    for d, s in zip(ds, starts, strict=True):
        alone = _alone(model, d, backend)
        iso.append((packed[s: s + len(d)] - alone).abs().max().item())
        sem.append((alone - _alone(reference, d, "eager")).abs().max().item())
    assert max(iso) <= 1e-5, f"{family}/{backend}: packed vs alone max error {max(iso):.3g} per document {iso}"
    assert max(sem) <= 1e-5, f"{family}/{backend}: vs transformers eager {max(sem):.3g} per document {sem}"


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if attention_semantics(tiny_family_config(f)).sliding])
def test_family_sliding_window_changes_the_logits(docs, family):
    """Control: the fixtures' window (4) matters for these documents, so the equality above checks it."""
    _, ds, _ = docs
    windowed = tiny_family_model(family, V, attn_implementation="eager")
    wide = tiny_family_model(family, V, attn_implementation="eager", sliding_window=1000)
    d = ds[1]   # 9 tokens
    assert (_alone(windowed, d, "eager") - _alone(wide, d, "eager")).abs().max().item() > 1e-2


def test_family_gemma2_softcap_changes_the_logits_and_flex_applies_it(family_dirs, docs):
    _, ds, _ = docs
    capped = _load(family_dirs, "gemma2", "flex")
    uncapped = tiny_family_model("gemma2", V, attn_implementation="eager", attn_logit_softcapping=None)
    d = ds[1]
    assert (_alone(capped, d, "flex") - _alone(uncapped, d, "eager")).abs().max().item() > 1e-2
    assert attention_semantics(capped.config).attn_softcap == 2.0


def test_family_leak_control(family_dirs, docs):
    """Without restarting positions (one causal sequence per row) later documents change: the matrix above
    could fail."""
    batch, ds, _ = docs
    model = _load(family_dirs, "mistral", "sdpa")
    ids = batch.input_ids.reshape(2, BUDGET)
    with torch.no_grad():
        leaky = model(input_ids=ids[:1], use_cache=False).logits[0, 5:14]
    assert (leaky - _alone(model, ds[1], "sdpa")).abs().max().item() > 1e-2


# ------------------------------------------------------------------------------------------ refused pairs

REFUSED = [
    # (family, overrides of the tiny config, backend, training, words of the message)
    ("gemma2", {}, "sdpa", False, "family Gemma2 (gemma2) with evaluate.attention=sdpa is refused: attention logit "
                                  "soft-capping (2) cannot run on sdpa"),
    ("gemma2", {"final_logit_softcapping": None}, "sdpa", True,
     "family Gemma2 (gemma2) with train.attention=sdpa is refused: attention logit soft-capping (2) cannot run on "
     "sdpa: torch's scaled_dot_product_attention has no soft-cap"),
    ("gemma2", {}, "varlen", False, "with evaluate.attention=varlen is refused: attention logit soft-capping (2) "
                                    "cannot run on varlen: torch's varlen_attn (FlashAttention varlen) has no "
                                    "soft-cap argument"),
    ("gemma2", {}, "varlen", True, "family Gemma2 (gemma2) with train.attention=varlen is refused: attention logit "
                                   "soft-capping (2) cannot run on varlen"),
    ("qwen2", {"attention_dropout": 0.1}, "flex", True,
     "family Qwen2 (qwen2) with train.attention=flex is refused: attention_dropout 0.1 would be silently skipped"),
    ("phi3", {"attention_dropout": 0.1}, "varlen", True, "attention_dropout 0.1 would be silently skipped by the "
                                                         "varlen backend"),
]


@pytest.mark.parametrize("family,overrides,backend,training,words", REFUSED)
def test_family_refused_pairs(family_dirs, tmp_path, family, overrides, backend, training, words):
    d = build_tiny_family_dir(tmp_path / family, family, V, **overrides) if overrides else family_dirs[family]
    with pytest.raises(ConfigError) as e:
        check_attention(tiny_family_model(family, V, **overrides).config, backend, training)
    assert words in str(e.value), str(e.value)
    if backend != "varlen":     # the builder refuses the same way before loading any weight
        with pytest.raises(ConfigError, match="refused") as e:
            build_model(ModelConfig(init_from=str(d)), V, attention=backend, training=training)
        assert words in str(e.value) and str(d) in str(e.value)


def test_family_training_allowed_pairs():
    """What is not refused: every other (family, backend) pair trains (varlen needs CUDA to run)."""
    allowed = {(f, b) for f in FAMILY_NAMES for b in ("sdpa", "eager", "flex", "varlen")
               if refusal(attention_semantics(tiny_family_model(f).config), b, training=True) is None}
    refused = {(f, b) for f in FAMILY_NAMES for b in ("sdpa", "eager", "flex", "varlen")} - allowed
    assert refused == {("gemma2", "sdpa"), ("gemma2", "varlen")}   # attention soft-cap: no such kernel argument
    assert set(FAMILIES) == set(FAMILY_NAMES)


def test_family_sliding_window_refused_on_a_varlen_without_window(monkeypatch):
    """torch 2.9/2.10's varlen_attn has no window_size: a sliding-window family must not run there."""
    import packtrain.model.attention as attention

    monkeypatch.setattr(attention, "varlen_supports_window", lambda: False)
    with pytest.raises(ConfigError, match="family Mistral \\(mistral\\) with train.attention=varlen is refused: its "
                                          "sliding window cannot run on varlen: this torch's varlen_attn has no "
                                          "window_size argument"):
        check_attention(tiny_family_model("mistral").config, "varlen")
    assert refusal(attention_semantics(tiny_family_model("llama").config), "varlen", True) is None


def test_family_attention_functions_never_drop_semantics():
    """The registered kernels raise on what they cannot compute (a model loaded around the setup checks)."""
    from packtrain.model.attention import flex_attention_forward, varlen_attention_forward

    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="cannot soft-cap"):
        varlen_attention_forward(None, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 4]), max_length_q=4,
                                 softcap=2.0)
    with pytest.raises(ValueError, match="no dropout"):
        flex_attention_forward(None, q, q, q, _block_mask(4), dropout=0.1)
    with pytest.raises(ValueError, match="attention sinks"):
        flex_attention_forward(None, q, q, q, _block_mask(4), s_aux=torch.zeros(2))


def _block_mask(n):
    from packtrain.model.attention import document_block_mask

    return document_block_mask(torch.zeros(1, n, dtype=torch.long))


def test_family_gemma2_packed_loss_applies_the_final_softcap_like_its_own_forward():
    """The packed loss (every mode) and the evaluate loss equal the cross-entropy of the model's own capped logits."""
    import torch
    import torch.nn.functional as F

    from packtrain.evaluate.perplexity import batch_loss_sum
    from packtrain.testing.tiny_families import tiny_family_model
    from packtrain.train.loss import packed_causal_lm

    model = tiny_family_model("gemma2", vocab_size=64, attn_implementation="eager")
    assert model.config.final_logit_softcapping
    ids = torch.randint(3, 64, (1, 12))
    labels = ids.clone()
    labels[0, 0] = -100
    kw = {"input_ids": ids, "position_ids": torch.arange(12)[None], "use_cache": False}
    with torch.no_grad():
        logits = model(**kw).logits.float()[0, :-1]          # the model applies cap·tanh(x/cap) itself
        ref = F.cross_entropy(logits, ids[0, 1:], reduction="sum")
        for loss in ("standard", "chunked"):
            got = packed_causal_lm(model, loss, chunk_tokens=5)(labels=labels, **kw)
            assert torch.allclose(got, ref, atol=1e-5), (loss, got, ref)
        total, n = batch_loss_sum(model, kw, labels)
        assert n == 11 and abs(float(total) - float(ref)) < 1e-4
        uncapped = F.cross_entropy(model.lm_head(model.model(**kw).last_hidden_state)[0, :-1].float(), ids[0, 1:],
                                   reduction="sum")
        assert abs(float(uncapped) - float(ref)) > 1e-3    # the cap matters for this model: the test can fail
