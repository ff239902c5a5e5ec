"""The train / eval split of a documents table (tokenize holds out; the contamination check reads the same split):
document i is held out when u(doc_id) < eval_fraction, u = splitmix64(doc_id) / 2^64 — a fixed hash, the same
on every machine and run, independent of document order (packtrain.data.tokenize's module doc)."""

from __future__ import annotations

import numpy as np

from packtrain.data.token_store import SPLIT_EVAL, SPLIT_TRAIN


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorized splitmix64 (uint64 → uint64), a fixed bijective mixer."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def doc_hash_unit(doc_ids: np.ndarray) -> np.ndarray:
    """u(doc_id) in [0, 1), float64 [n]: the top 53 bits of splitmix64(doc_id)."""
    return (_splitmix64(np.asarray(doc_ids, dtype=np.int64).view(np.uint64)) >> np.uint64(11)).astype(
        np.float64) / float(1 << 53)


def split_eval(doc_ids: np.ndarray, eval_fraction: float) -> np.ndarray:
    """uint8 [n]: 1 (eval) where u(doc_id) < eval_fraction, else 0 (train); see the module docstring.

    >>> split_eval(np.arange(5), 0.0).tolist()
    [0, 0, 0, 0, 0]
    """
    u = doc_hash_unit(doc_ids)
    split = np.where(u < eval_fraction, SPLIT_EVAL, SPLIT_TRAIN).astype(np.uint8)
    if eval_fraction > 0 and len(u) >= 2:
        if not (split == SPLIT_EVAL).any():
            split[int(np.argmin(u))] = SPLIT_EVAL
        if not (split == SPLIT_TRAIN).any():
            split[int(np.argmax(u))] = SPLIT_TRAIN
    return split
