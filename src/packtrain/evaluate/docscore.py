"""Per-document negative log-likelihood of a text suite: the same code, packing and precision for every model.

    score_documents(model, tokenizer, docs, budget, rows, precision, backend, device) -> DocScores
      nll[d]     Σ −ln p(token) over document d's scored tokens (nats, fp64)
      tokens[d]  scored tokens of d (this tokenizer's)
      bytes[d]   UTF-8 bytes of d's scored pieces (the same for every tokenizer)

Each document is encoded piece by piece behind one start token (the tokenizer's BOS, else its EOS), so its
first text token is predicted too: `[s] p0 p1 | c0 c1 c2` with mask `0 0 0 1 1 1` scores c0..c2. A document
longer than `budget` is cut into chunks that overlap by one token (chunk k = ids[k·(B−1) : k·(B−1)+B]); the
overlap token is context only, so every token is predicted exactly once:

    ids      s a b c d e f        budget 4 → chunks [s a b c] [c d e f]
    scored     a b c   d e f       (c is the first, context-only position of the second chunk)

Chunks are packed in document order into rows of `budget` (next fit; rows padded at the tail) and scored
`rows` rows per forward with per-document attention isolation (packtrain.packing.batches.build_batch +
packtrain.model.attention.model_inputs, use_cache=False). Deterministic: the same model, tokenizer and
documents give the same numbers bit for bit on the CPU (fp32).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from packtrain.errors import InputDataError

if TYPE_CHECKING:
    from packtrain.evaluate.suite_types import SuiteDoc

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass
class DocScores:
    nll: np.ndarray       # float64 [n_docs] nats
    tokens: np.ndarray    # int64 [n_docs]
    bytes: np.ndarray     # int64 [n_docs]
    seconds: float = 0.0  # wall time of the forwards (batch building on the host included), device synchronized


def encode_doc(doc: SuiteDoc, tokenizer) -> tuple[list[int], list[int]]:
    """(ids, mask) of one document: start token + each piece encoded on its own (module doc)."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    ids, mask = [int(start if start is not None else 0)], [0]
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else None
    for p in doc.pieces:
        e = (list(backend.encode(p.text, add_special_tokens=False).ids) if backend is not None
             else list(tokenizer(p.text, add_special_tokens=False)["input_ids"]))
        ids += e
        mask += [int(p.scored)] * len(e)
    return ids, mask


def chunk(ids: list[int], mask: list[int], budget: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Chunks of ≤ budget tokens overlapping by one (module doc); each chunk's first mask value is 0.

    >>> [(c.tolist(), m.tolist()) for c, m in chunk([9, 1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 1, 1, 1], 4)]
    [([9, 1, 2, 3], [0, 1, 1, 1]), ([3, 4, 5, 6], [0, 1, 1, 1])]
    """
    a, m = np.asarray(ids, np.int64), np.asarray(mask, np.uint8)
    out, s = [], 0
    while s + 1 < len(a):
        c, cm = a[s: s + budget], m[s: s + budget].copy()
        cm[0] = 0
        out.append((c, cm))
        s += budget - 1
    return out


def _rows(chunks: list[tuple[int, np.ndarray, np.ndarray]], budget: int):
    """Next-fit rows: [(tokens, seg_lens, mask, doc index per segment)]."""
    rows: list = []
    cur: list = []
    used = 0
    for d, c, m in chunks:
        if used + len(c) > budget and cur:
            rows.append(cur)
            cur, used = [], 0
        cur.append((d, c, m))
        used += len(c)
    if cur:
        rows.append(cur)
    return [(np.concatenate([c for _, c, _ in r]), np.array([len(c) for _, c, _ in r], np.int64),
             np.concatenate([m for _, _, m in r]), [d for d, _, _ in r]) for r in rows]


@dataclass
class PackedDocs:
    """A suite's documents encoded with one tokenizer and packed into rows of `budget` (CPU only): the part of
    scoring that depends on the tokenizer, not on the model — two models with the same tokenizer share it."""

    rows: list            # [(tokens, seg_lens, mask, doc index per segment)] (`_rows`)
    tokens: np.ndarray    # int64 [n_docs] scored tokens
    bytes: np.ndarray     # int64 [n_docs] UTF-8 bytes
    budget: int
    pad_id: int


def pack_documents(docs: list[SuiteDoc], tokenizer, budget: int, suite: str = "") -> PackedDocs:
    """Encode (encode_doc), chunk and pack the documents (module doc)."""
    n = len(docs)
    tokens = np.zeros(n, np.int64)
    chunks = []
    for d, doc in enumerate(docs):
        ids, mask = encode_doc(doc, tokenizer)
        tokens[d] = int(sum(mask))
        chunks += [(d, c, m) for c, m in chunk(ids, mask, budget)]
    if int(tokens.sum()) == 0:
        raise InputDataError(f"suite {suite!r}: its {n} documents tokenize to no scored token with this model's "
                             "tokenizer (empty texts or completions?)")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return PackedDocs(_rows(chunks, budget), tokens, np.array([doc.n_bytes for doc in docs], np.int64), budget,
                      int(pad))


def score_packed(model, packed: PackedDocs, rows: int, precision: str = "fp32", backend: str = "sdpa",
                 device=None, compiled: bool = False, on_docs: Callable[[int], None] | None = None) -> DocScores:
    """Per-document NLL of packed documents, `rows` rows per forward. The scored positions and their documents
    are found on the host before each batch is copied, and the per-token losses stay on the device until the
    end: one device→host sync per suite, not per batch. `on_docs(k)` after each forward: the first k documents
    are scored (rows hold the documents in order, so every document before the next row's first is done)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from packtrain.model.attention import model_inputs
    from packtrain.packing.batches import IGNORE, build_batch
    from packtrain.train.loss import softcap_logits

    device = device or next(model.parameters()).device
    budget, n = packed.budget, len(packed.tokens)
    base, head = model.base_model, model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None) or None
    amp = (torch.autocast(device.type, dtype=getattr(torch, _DTYPES[precision]))
           if precision in _DTYPES else contextlib.nullcontext())
    losses, owners = [], []
    t0 = time.perf_counter()
    with torch.inference_mode(), amp:
        for i in range(0, len(packed.rows), rows):
            group = packed.rows[i: i + rows]
            group += [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8), [])] * (rows - len(group))
            b = build_batch([g[0] for g in group], [g[1] for g in group], budget, pad_id=packed.pad_id,
                            rows_masks=[g[2] for g in group])
            # document index of every slot: segments in row order, padding → −1
            seg_doc = np.full(rows * budget, -1, np.int64)
            for r, g in enumerate(group):
                off = r * budget
                for d, ln in zip(g[3], g[1], strict=True):
                    seg_doc[off: off + ln] = d
                    off += ln
            keep = (b.labels[0, 1:] != IGNORE).numpy()
            done = packed.rows[i + rows][3][0] if i + rows < len(packed.rows) else n   # documents scored after it
            if not keep.any():
                if on_docs is not None:
                    on_docs(done)
                continue
            index = torch.from_numpy(np.flatnonzero(keep))
            owners.append(seg_doc[1:][keep])
            b, index = b.to(device), index.to(device, non_blocking=True)
            hidden = base(**model_inputs(b, backend, compiled)).last_hidden_state   # (rows, B, H) or (1, T, H)
            hidden = hidden.reshape(-1, hidden.shape[-1])                         # (T, H)
            target = b.labels[0, 1:]                                               # (T-1,)
            logits = softcap_logits(head(hidden[:-1].index_select(0, index)).float(), cap)   # (N, V)
            losses.append(F.cross_entropy(logits, target.index_select(0, index), reduction="none").double())
            if on_docs is not None:
                on_docs(done)
    nll = torch.zeros(n, dtype=torch.float64)
    if losses:
        nll.index_add_(0, torch.from_numpy(np.concatenate(owners)), torch.cat(losses).cpu())   # syncs
    return DocScores(nll.numpy(), packed.tokens, packed.bytes, time.perf_counter() - t0)


def score_documents(model, tokenizer, docs: list[SuiteDoc], budget: int, rows: int, precision: str = "fp32",
                    backend: str = "sdpa", device=None, suite: str = "", compiled: bool = False) -> DocScores:
    """Per-document NLL, scored-token and byte counts (module doc): pack_documents then score_packed."""
    return score_packed(model, pack_documents(docs, tokenizer, budget, suite), rows, precision, backend, device,
                        compiled)
