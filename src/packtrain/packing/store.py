"""The pack store: packed documents on disk, memory-mapped by training and evaluation.

One directory per split (`<pack_dir>/train/`, `<pack_dir>/eval/`)::

    tokens.bin        uint32 [n_tokens]        real tokens of every pack back to back, in pack order (no padding)
    pack_offsets.npy  int64  [n_packs + 1]     pack p's tokens = tokens[pack_offsets[p]:pack_offsets[p+1]]
    seg_offsets.npy   int64  [n_packs + 1]     pack p's segments = segments[seg_offsets[p]:seg_offsets[p+1]]
    segments.npy      int64  [n_segments, 3]   (doc_id, start, length): tokens [start, start+length) of the
                                               token store document `doc_id`, in the order they lie in the pack
    meta.json         {"format": "packtrain.packs", "version": 1, "budget", "n_packs", "n_segments",
                       "n_tokens", "vocab_size", "pad_id", "eos_id", "strategy", "seed", "split",
                       "loss_mask": bool, "chunk_positions": "restart" | "continue", "checksums": {file: crc32}}
                                               chunk_positions: position ids of split-document chunks
                                               (packtrain.packing.batches); absent in older stores = restart
    loss_mask.bin     uint8  [n_tokens]        only when the token store has one (chat / prompt-completion):
                                               1 = learned, aligned with tokens.bin byte for token (the same
                                               gather), so it follows every strategy, split and shuffle

Example, budget 8, documents 7 (len 5), 9 (len 2), 4 (len 6)::

    tokens.bin        [a a a a a b b | c c c c c c]
    pack_offsets.npy  [0, 7, 13]
    seg_offsets.npy   [0, 2, 3]
    segments.npy      [[7, 0, 5], [9, 0, 2], [4, 0, 6]]

`write_pack_store` writes into a staging directory and publishes it as one unit (packtrain.publish.publish_dir),
so a crash never leaves a half-written store. `PackStore.open` checks every file's checksum (tokens.bin's by default only when it is at
most `VERIFY_TOKENS_MAX_BYTES`; crc32 reads ~1 GB/s), shapes, offsets and the budget, and raises
`InputDataError` naming the broken file.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtrain.errors import InputDataError, MissingDataError
from packtrain.publish import publish_dir, staging_dir

FORMAT, VERSION = "packtrain.packs", 1
FILES = ("tokens.bin", "pack_offsets.npy", "seg_offsets.npy", "segments.npy")
VERIFY_TOKENS_MAX_BYTES = 1 << 30


def file_crc32(path: Path, chunk: int = 1 << 24) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


@dataclass
class PackStore:
    """An opened pack store (one split). Arrays are memory-mapped or small."""

    root: Path
    tokens: np.ndarray        # uint32 memmap [n_tokens]
    pack_offsets: np.ndarray  # int64 [n_packs + 1]
    seg_offsets: np.ndarray   # int64 [n_packs + 1]
    segments: np.ndarray      # int64 [n_segments, 3] (doc_id, start, length)
    meta: dict
    loss_mask: np.ndarray | None = None   # uint8 memmap [n_tokens]; None → every token learned

    def pack_mask(self, p: int) -> np.ndarray | None:
        """uint8 [len(pack p)] loss mask of pack p, None when the store has none (all learned)."""
        if self.loss_mask is None:
            return None
        return self.loss_mask[self.pack_offsets[p]: self.pack_offsets[p + 1]]

    @property
    def n_packs(self) -> int:
        return len(self.pack_offsets) - 1

    @property
    def budget(self) -> int:
        return int(self.meta["budget"])

    @property
    def chunk_positions(self) -> str:
        """restart | continue, from meta.json (stores written before the key existed: restart)."""
        value = self.meta.get("chunk_positions", "restart")
        if value not in ("restart", "continue"):
            raise InputDataError(f"pack store {self.root / 'meta.json'}: chunk_positions {value!r}; allowed "
                                 "'restart', 'continue'")
        return value

    @property
    def pad_id(self) -> int:
        """Token used for padding: meta pad_id, else eos_id, else 0 (its labels are -100 either way)."""
        for key in ("pad_id", "eos_id"):
            if self.meta.get(key) is not None:
                return int(self.meta[key])
        return 0

    def pack_tokens(self, p: int) -> np.ndarray:
        """uint32 [len(pack p)] real tokens of pack p."""
        return self.tokens[self.pack_offsets[p]: self.pack_offsets[p + 1]]

    def pack_segments(self, p: int) -> np.ndarray:
        """int64 [n_seg, 3] (doc_id, start, length) of pack p."""
        return self.segments[self.seg_offsets[p]: self.seg_offsets[p + 1]]

    def pack_lengths(self) -> np.ndarray:
        """int64 [n_packs] real tokens per pack."""
        return np.diff(self.pack_offsets)

    @classmethod
    def open(cls, root: str | Path, verify: bool | None = None) -> PackStore:
        """Open and validate a split directory. `verify`: check tokens.bin's crc32 (None → when ≤ 1 GiB)."""
        root = Path(root)
        if not root.is_dir():
            raise MissingDataError(f"pack store {root} does not exist: run `packtrain pack` first")
        meta_path = root / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            raise MissingDataError(f"pack store {root}: missing meta.json") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise InputDataError(f"pack store {meta_path} is corrupt: {e}") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise InputDataError(f"pack store {meta_path}: format {meta.get('format')!r} version "
                                 f"{meta.get('version')!r}, expected {FORMAT!r} version {VERSION}")
        sums = meta.get("checksums") or {}
        try:
            n_tok, n_packs, n_seg, budget = (int(meta[k]) for k in ("n_tokens", "n_packs", "n_segments", "budget"))
        except (KeyError, TypeError, ValueError) as e:
            raise InputDataError(f"pack store {meta_path} is corrupt: bad or missing field {e}") from None
        for name in FILES:
            path = root / name
            if not path.exists():
                raise MissingDataError(f"pack store {root}: missing {name}")
            if name == "tokens.bin":
                size = path.stat().st_size
                if size != 4 * n_tok:
                    raise InputDataError(f"pack store {path} is corrupt: {size} bytes, meta.json says "
                                         f"{n_tok} uint32 tokens ({4 * n_tok} bytes)")
                if verify is False or (verify is None and size > VERIFY_TOKENS_MAX_BYTES):
                    continue
            if name in sums and file_crc32(path) != int(sums[name]):
                raise InputDataError(f"pack store {path} is corrupt: crc32 differs from meta.json")
        arrays = {}
        for name in FILES[1:]:
            try:
                arrays[name] = np.load(root / name, allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise InputDataError(f"pack store {root / name} is corrupt: {e}") from None
        po, so, seg = arrays["pack_offsets.npy"], arrays["seg_offsets.npy"], arrays["segments.npy"]
        _check(root / "pack_offsets.npy", po, n_packs, n_tok)
        _check(root / "seg_offsets.npy", so, n_packs, n_seg)
        if seg.shape != (n_seg, 3) or seg.dtype.kind not in "iu":
            raise InputDataError(f"pack store {root / 'segments.npy'} is corrupt: shape {seg.shape} "
                                 f"dtype {seg.dtype}, expected ({n_seg}, 3) integers")
        plen = np.diff(po)
        if n_seg and (seg[:, 2].min() < 1 or seg[:, 1].min() < 0):
            raise InputDataError(f"pack store {root / 'segments.npy'} is corrupt: a segment has length < 1 "
                                 "or start < 0")
        cum = np.concatenate([[0], np.cumsum(seg[:, 2])])
        if not np.array_equal(cum[so], po):
            raise InputDataError(f"pack store {root / 'segments.npy'} is corrupt: segment lengths do not add "
                                 "up to the pack lengths in pack_offsets.npy")
        if n_packs and plen.max() > budget:
            raise InputDataError(f"pack store {root / 'pack_offsets.npy'} is corrupt: a pack holds "
                                 f"{int(plen.max())} tokens > budget {budget}")
        tokens = (np.memmap(root / "tokens.bin", dtype=np.uint32, mode="r", shape=(n_tok,))
                  if n_tok else np.zeros(0, np.uint32))
        mask = _open_mask(root, meta, n_tok, sums, verify)
        return cls(root, tokens, po.astype(np.int64), so.astype(np.int64), seg.astype(np.int64), meta, mask)


def _open_mask(root: Path, meta: dict, n_tok: int, sums: dict, verify: bool | None) -> np.ndarray | None:
    """loss_mask.bin when meta says there is one: size n_tok bytes, crc32 as recorded (like tokens.bin)."""
    path = root / "loss_mask.bin"
    if not meta.get("loss_mask"):
        return None
    if not path.is_file():
        raise MissingDataError(f"pack store {root}: missing loss_mask.bin (meta.json says loss_mask: true)")
    size = path.stat().st_size
    if size != n_tok:
        raise InputDataError(f"pack store {path} is corrupt: {size} bytes, meta.json says {n_tok} tokens "
                             "(one uint8 mask value per token)")
    check = verify is True or (verify is None and size <= VERIFY_TOKENS_MAX_BYTES)
    if check and "loss_mask.bin" in sums and file_crc32(path) != int(sums["loss_mask.bin"]):
        raise InputDataError(f"pack store {path} is corrupt: crc32 differs from meta.json")
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(n_tok,)) if n_tok else np.zeros(0, np.uint8)


def _check(path: Path, off: np.ndarray, n_packs: int, total: int) -> None:
    if off.shape != (n_packs + 1,) or off.dtype.kind not in "iu":
        raise InputDataError(f"pack store {path} is corrupt: shape {off.shape} dtype {off.dtype}, "
                             f"expected ({n_packs + 1},) integers")
    if off[0] != 0 or off[-1] != total or np.any(np.diff(off) < 0):
        raise InputDataError(f"pack store {path} is corrupt: offsets must rise from 0 to {total}")


def write_pack_store(root: str | Path, token_chunks: Iterable[np.ndarray], pack_offsets: np.ndarray,
                     seg_offsets: np.ndarray, segments: np.ndarray, meta: dict,
                     mask_chunks: Iterable[np.ndarray] | None = None) -> Path:
    """Write a split atomically. `token_chunks` yields uint32 arrays whose concatenation is tokens.bin
    (streamed, so the whole split never sits in memory); `mask_chunks` likewise the uint8 loss_mask.bin (None:
    no mask). Returns `root`."""
    root = Path(root)
    tmp = staging_dir(root)
    try:
        crc, n_tok = 0, 0
        with open(tmp / "tokens.bin", "wb") as f:
            for chunk in token_chunks:
                b = np.ascontiguousarray(chunk, dtype=np.uint32).tobytes()
                crc = zlib.crc32(b, crc)
                n_tok += len(b) // 4
                f.write(b)
        if n_tok != int(pack_offsets[-1]):
            raise ValueError(f"wrote {n_tok} tokens, pack_offsets ends at {int(pack_offsets[-1])}")
        mask_meta: dict = {}
        if mask_chunks is not None:
            mcrc, n_mask = 0, 0
            with open(tmp / "loss_mask.bin", "wb") as f:
                for chunk in mask_chunks:
                    b = np.ascontiguousarray(chunk, dtype=np.uint8).tobytes()
                    mcrc = zlib.crc32(b, mcrc)
                    n_mask += len(b)
                    f.write(b)
            if n_mask != n_tok:
                raise ValueError(f"wrote {n_mask} mask values for {n_tok} tokens")
            mask_meta = {"loss_mask": True}
        np.save(tmp / "pack_offsets.npy", np.asarray(pack_offsets, np.int64))
        np.save(tmp / "seg_offsets.npy", np.asarray(seg_offsets, np.int64))
        np.save(tmp / "segments.npy", np.asarray(segments, np.int64).reshape(-1, 3))
        sums = {"tokens.bin": crc}
        sums.update({n: file_crc32(tmp / n) for n in FILES[1:]})
        if mask_chunks is not None:
            sums["loss_mask.bin"] = mcrc
        full = {"format": FORMAT, "version": VERSION, **meta, **mask_meta, "n_packs": len(pack_offsets) - 1,
                "n_segments": int(len(segments)), "n_tokens": n_tok, "checksums": sums}
        (tmp / "meta.json").write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
        publish_dir(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


