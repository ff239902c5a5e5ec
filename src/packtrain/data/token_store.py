"""The token store: the tokenize stage's output, memory-mapped by the pack stage.

    <dir>/tokens.bin    uint32, all documents' token ids back to back        [Σ n_tokens]
    <dir>/offsets.npy   int64, document i is tokens[offsets[i]:offsets[i+1]]  [n_docs + 1]
    <dir>/doc_ids.npy   int64, the documents table's doc_id of each document [n_docs]
    <dir>/split.npy     uint8, 0 = train, 1 = eval (held out by a hash of doc_id) [n_docs]
    <dir>/meta.json     {"vocab_size", "eos_id", "pad_id", "bos_id", "n_docs", "n_tokens", "dtype": "uint32",
                         "max_token_id",                  the largest id in tokens.bin (-1: no tokens)
                         "tokenizer",                     "trained" or the directory it was loaded from
                         "tokenizer_hash",                sha256 of the tokenizer (packtrain.data.tokenizer_files)
                         "tokenizer_from",                model.init_from when it came with the init model
                         "special_prefix", "special_suffix"}   ids the tokenizer's rules put around a text
    <dir>/tokenizer/    AutoTokenizer.from_pretrained-loadable
    <dir>/loss_mask.bin uint8, 1 = the token is learned (assistant content + end-of-turn, a completion), 0 = not
                        (system/user turns, a prompt, template markup) [Σ n_tokens]; only when the documents
                        hold chat / prompt-completion records (meta "loss_mask": true). No file = every token
                        is learned (plain text, and every store written before masks existed).

A document and its mask (built-in template, packtrain.data.chat), tokens shown as text:

    tokens     <|im_start|>user\n  Hi  <|im_end|>\n  <|im_start|>assistant\n  Yo  <|im_end|>  \n  <eos>
    loss_mask  0 ...               0   0 ...        0 ...                    1   1 ...       0   1

The train stage refuses a store whose `tokenizer_hash` differs from the init model's tokenizer, or whose
`max_token_id` does not fit the model's vocabulary (packtrain.model.warm_start.check_store_matches_model).

Written with `write_token_store` / `TokenStoreWriter` into a staging dir and published as one unit
(packtrain.publish.publish_dir), so a crash never leaves a half-written store; `TokenStore.open` checks shapes
and bounds and names the broken file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtrain.errors import InputDataError, MissingDataError
from packtrain.publish import publish_dir, staging_dir

SPLIT_TRAIN, SPLIT_EVAL = 0, 1


@dataclass
class TokenStore:
    root: Path
    tokens: np.ndarray   # uint32 memmap [N_tokens]
    offsets: np.ndarray  # int64 [n_docs + 1]
    doc_ids: np.ndarray  # int64 [n_docs]
    split: np.ndarray    # uint8 [n_docs]
    meta: dict
    loss_mask: np.ndarray | None = None   # uint8 memmap [N_tokens], None → every token learned

    def doc_mask(self, i: int) -> np.ndarray:
        """uint8 [len(doc i)]: document i's loss mask (all ones without a mask file)."""
        if self.loss_mask is None:
            return np.ones(int(self.offsets[i + 1] - self.offsets[i]), np.uint8)
        return self.loss_mask[self.offsets[i]: self.offsets[i + 1]]

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int | None:
        return self.meta.get("eos_id")

    @property
    def max_token_id(self) -> int:
        """The largest token id in the store (-1 when empty): meta.json's, else one pass over tokens.bin."""
        if "max_token_id" in self.meta:
            return int(self.meta["max_token_id"])
        top = -1
        for i in range(0, len(self.tokens), 1 << 24):   # 64 MiB of uint32 at a time
            top = max(top, int(self.tokens[i:i + (1 << 24)].max()))
        return top

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
        mask = None
        mask_path = root / "loss_mask.bin"
        if meta.get("loss_mask") or mask_path.exists():
            if not mask_path.is_file() or mask_path.stat().st_size != n_tok:
                size = mask_path.stat().st_size if mask_path.is_file() else "missing"
                raise InputDataError(f"token store {mask_path} is corrupt: {size} bytes, meta.json says "
                                     f"{n_tok} tokens (one uint8 mask value per token)")
            mask = np.memmap(mask_path, dtype=np.uint8, mode="r", shape=(n_tok,)) if n_tok else np.zeros(0, np.uint8)
        return cls(root, tokens, offsets, doc_ids, split, meta, mask)


class TokenStoreWriter:
    """Streams documents' token ids into a staging directory beside `root`; `finish()` writes the index files
    and publishes the directory as one unit. Memory is O(documents) (8 bytes each), not O(tokens). Used as a
    context manager, an exception removes the staging dir and leaves `root` as it was.

        with TokenStoreWriter(out) as w:
            for ids in encoded_documents:
                w.append(ids)
            store = w.finish(doc_ids, split, meta, tokenizer_dir)

    `publish=False`: write straight into `root`, which must be new or empty — for a caller that builds `root`
    as part of its own staging directory and publishes that (the tokenize stage). `w.dir` is where the
    files go (e.g. save the tokenizer to `w.dir / "tokenizer"` instead of passing `tokenizer_dir`).
    """

    def __init__(self, root: str | Path, publish: bool = True, loss_mask: bool = False):
        from array import array

        self.root = Path(root)
        self.publish = publish
        if publish:
            self.dir = staging_dir(self.root)
        else:
            self.dir = self.root
            self.dir.mkdir(parents=True, exist_ok=True)
            if any(self.dir.iterdir()):
                raise ValueError(f"TokenStoreWriter(publish=False) needs a new or empty directory: {self.dir}")
        self._f = open(self.dir / "tokens.bin", "wb")  # noqa: SIM115 - closed by finish()/abort()
        self._m = open(self.dir / "loss_mask.bin", "wb") if loss_mask else None  # noqa: SIM115 - likewise
        self._lengths = array("q")
        self._max = -1

    def enable_mask(self) -> None:
        """Keep a loss mask from now on (before the first append): for a caller that learns it needs one late."""
        if self._lengths:
            raise ValueError("enable_mask() after documents were appended")
        if self._m is None:
            self._m = open(self.dir / "loss_mask.bin", "wb")  # noqa: SIM115 - closed by finish()/abort()

    def append(self, ids, mask=None) -> None:
        """One document's ids; `mask` (same length, 0/1) when the writer keeps a loss mask (None → all 1)."""
        a = np.asarray(ids, dtype=np.uint32)
        self._f.write(a.tobytes())
        if self._m is not None:
            m = np.ones(len(a), np.uint8) if mask is None else np.asarray(mask, dtype=np.uint8)
            if m.shape != a.shape:
                raise ValueError(f"loss mask of {len(m)} values for {len(a)} ids")
            self._m.write(m.tobytes())
        self._lengths.append(len(a))
        if len(a):
            self._max = max(self._max, int(a.max()))

    def finish(self, doc_ids: np.ndarray, split: np.ndarray, meta: dict,
               tokenizer_dir: Path | None = None) -> TokenStore:
        self._f.close()
        if self._m is not None:
            self._m.close()
        n = len(self._lengths)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self._lengths, dtype=np.int64) if n else np.zeros(0, np.int64), out=offsets[1:])
        np.save(self.dir / "offsets.npy", offsets)
        np.save(self.dir / "doc_ids.npy", np.asarray(doc_ids, dtype=np.int64))
        np.save(self.dir / "split.npy", np.asarray(split, dtype=np.uint8))
        meta = {**meta, "n_docs": int(n), "n_tokens": int(offsets[-1]), "dtype": "uint32",
                "max_token_id": self._max}
        if self._m is not None:
            meta["loss_mask"] = True
        (self.dir / "meta.json").write_text(json.dumps(meta, indent=2))
        if tokenizer_dir is not None:
            shutil.copytree(tokenizer_dir, self.dir / "tokenizer")
        store = TokenStore.open(self.dir)   # check before publishing
        if not self.publish:
            return store
        del store
        publish_dir(self.dir, self.root)
        return TokenStore.open(self.root)

    def abort(self) -> None:
        self._f.close()
        if self._m is not None:
            self._m.close()
        if self.publish:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TokenStoreWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.abort()


def write_token_store(root: str | Path, token_arrays: list[np.ndarray], doc_ids: np.ndarray,
                      split: np.ndarray, meta: dict, tokenizer_dir: Path | None = None,
                      masks: list[np.ndarray] | None = None) -> TokenStore:
    """Write a token store atomically (temp dir + rename). `token_arrays[i]` are document i's ids, `masks[i]`
    its loss mask (None: no mask file, every token learned)."""
    with TokenStoreWriter(root, loss_mask=masks is not None) as w:
        for i, a in enumerate(token_arrays):
            w.append(a, None if masks is None else masks[i])
        return w.finish(doc_ids, split, meta, tokenizer_dir)
