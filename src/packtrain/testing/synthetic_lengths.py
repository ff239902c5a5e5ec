"""Synthetic document lengths and token stores for the packing benchmark and tests.

    length_set("lognormal", 1_000_000, 2048)   lognormal(median 300, σ 1), clipped to [16, 2048]
    length_set("pareto", ...)                  64·(1 + Pareto(α 1.5)), clipped to [64, 2048]: heavy tail, and
                                               no document shorter than 64 (gaps < 64 cannot be filled)
    length_set("uniform", ...)                 uniform integers in [1, 2048]

The issue's TRL anchors use the same three families at budget 2048 (lengths clipped to the budget), so the
sets scale their parameters with the budget: median 300/2048·B, Pareto scale 64/2048·B.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LENGTH_SETS = ("lognormal", "pareto", "uniform")


def length_set(kind: str, n: int, budget: int = 2048, seed: int = 0) -> np.ndarray:
    """int64 [n] document lengths in [1, budget] of one benchmark family (see module doc)."""
    rng = np.random.default_rng([seed, LENGTH_SETS.index(kind)])
    scale = budget / 2048
    if kind == "lognormal":
        x = rng.lognormal(np.log(300 * scale), 1.0, n)
        lo = max(1, round(16 * scale))
    elif kind == "pareto":
        x = (rng.pareto(1.5, n) + 1) * 64 * scale
        lo = max(1, round(64 * scale))
    elif kind == "uniform":
        return rng.integers(1, budget + 1, n).astype(np.int64)
    else:
        raise ValueError(f"length set {kind!r}: allowed {LENGTH_SETS}")
    return np.clip(np.round(x), lo, budget).astype(np.int64)


def write_random_token_store(root: str | Path, lengths, vocab_size: int = 1000, eval_fraction: float = 0.1,
                             seed: int = 0, eos_id: int | None = 1, pad_id: int | None = 0):
    """A token store (packtrain.data.token_store) of random ids with the given document lengths.
    doc_ids are 100 + 7·i (not positions, so tests notice a mix-up)."""
    from packtrain.data.token_store import write_token_store

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    docs = [rng.integers(0, vocab_size, int(n), dtype=np.int64) for n in lengths]
    split = (rng.random(len(lengths)) < eval_fraction).astype(np.uint8)
    doc_ids = 100 + 7 * np.arange(len(lengths), dtype=np.int64)
    return write_token_store(root, docs, doc_ids, split, {"vocab_size": vocab_size, "eos_id": eos_id,
                                                          "pad_id": pad_id})
