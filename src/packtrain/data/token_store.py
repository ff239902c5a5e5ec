"""The token store: the tokenize stage's output, memory-mapped by the pack stage.

    <dir>/tokens.bin    uint32, all documents' token ids back to back        [Σ n_tokens]
    <dir>/offsets.npy   int64, document i is tokens[offsets[i]:offsets[i+1]]  [n_docs + 1]
    <dir>/doc_ids.npy   int64, the documents table's doc_id of each document [n_docs]
    <dir>/split.npy     uint8, 0 = train, 1 = eval (held out by a hash of doc_id) [n_docs]
    <dir>/meta.json     {"vocab_size", "eos_id", "pad_id", "n_docs", "n_tokens", "dtype": "uint32"}
    <dir>/tokenizer/    AutoTokenizer.from_pretrained-loadable

Written with `write_token_store` into a temp dir and renamed into place, so a crash never leaves a
half-written store; `TokenStore.open` checks shapes and bounds and names the broken file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtrain.errors import InputDataError, MissingDataError
from packtrain.paths import replace_dir

SPLIT_TRAIN, SPLIT_EVAL = 0, 1


@dataclass
class TokenStore:
    root: Path
    tokens: np.ndarray   # uint32 memmap [N_tokens]
    offsets: np.ndarray  # int64 [n_docs + 1]
    doc_ids: np.ndarray  # int64 [n_docs]
    split: np.ndarray    # uint8 [n_docs]
    meta: dict

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int | None:
        return self.meta.get("eos_id")

    def lengths(self) -> np.ndarray:
        """Token count of every document, int64 [n_docs]."""
        return np.diff(self.offsets)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]: self.offsets[i + 1]]

    def select(self, split: int) -> np.ndarray:
        """Indices of the documents in a split (0 train, 1 eval)."""
        return np.flatnonzero(self.split == split)

    @classmethod
    def open(cls, root: str | Path) -> TokenStore:
        root = Path(root)
        if not root.is_dir():
            raise MissingDataError(f"token store {root} does not exist: run `packtrain tokenize` first")
        try:
            meta = json.loads((root / "meta.json").read_text())
            offsets = np.load(root / "offsets.npy")
            doc_ids = np.load(root / "doc_ids.npy")
            split = np.load(root / "split.npy")
            n_tok = int(meta["n_tokens"])
            tokens = (np.memmap(root / "tokens.bin", dtype=np.uint32, mode="r", shape=(n_tok,))
                      if n_tok else np.zeros(0, np.uint32))
        except FileNotFoundError as e:
            raise MissingDataError(f"token store {root}: missing {Path(e.filename).name}") from None
        except (ValueError, KeyError, json.JSONDecodeError, OSError) as e:
            raise InputDataError(f"token store {root} is corrupt: {e}") from None
        n = len(doc_ids)
        if offsets.shape != (n + 1,) or split.shape != (n,) or (n and offsets[-1] != n_tok):
            raise InputDataError(
                f"token store {root} is corrupt: offsets {offsets.shape}, doc_ids {doc_ids.shape}, "
                f"split {split.shape}, n_tokens {n_tok} disagree")
        if n and np.any(np.diff(offsets) < 0):
            raise InputDataError(f"token store {root} is corrupt: offsets.npy is not non-decreasing")
        return cls(root, tokens, offsets, doc_ids, split, meta)


def write_token_store(root: str | Path, token_arrays: list[np.ndarray], doc_ids: np.ndarray,
                      split: np.ndarray, meta: dict, tokenizer_dir: Path | None = None) -> TokenStore:
    """Write a token store atomically (temp dir + rename). `token_arrays[i]` are document i's ids."""
    root = Path(root)
    tmp = root.with_name(f".{root.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    lengths = np.fromiter((len(a) for a in token_arrays), dtype=np.int64, count=len(token_arrays))
    offsets = np.zeros(len(token_arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    with open(tmp / "tokens.bin", "wb") as f:
        for a in token_arrays:
            f.write(np.asarray(a, dtype=np.uint32).tobytes())
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "doc_ids.npy", np.asarray(doc_ids, dtype=np.int64))
    np.save(tmp / "split.npy", np.asarray(split, dtype=np.uint8))
    meta = {**meta, "n_docs": int(len(token_arrays)), "n_tokens": int(offsets[-1]), "dtype": "uint32"}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    if tokenizer_dir is not None:
        shutil.copytree(tokenizer_dir, tmp / "tokenizer")
    replace_dir(tmp, root)
    return TokenStore.open(root)
