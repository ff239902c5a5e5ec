"""A checkpoint's manifest.json and its verification: what makes a step_N directory one resume can trust.

    manifest.json       written last (checkpoint.commit_checkpoint): {"format": "packtrain.checkpoint",
                        "version": 2, "step", "interval_loss", ["eval_loss",] "files": {relpath: {"bytes",
                        "sha256_tree", "chunk_bytes"}}} (version 1 manifests, read as before, have "sha256" instead)

`verify_checkpoint(path)` is None for a complete, intact checkpoint, else the reason naming the file
("model.safetensors fails its sha256 checksum", "manifest.json is missing (partial write)"); `manifest_loss` reads
the number retention ranks by. The layout, saving, retention and quarantine are checkpoint.py's.

The checksum is a sha256 tree (`sha256_tree_file`): the sha256 of the concatenated sha256 digests of each
64 MiB piece, the pieces hashed in parallel threads (hashlib releases the GIL). One sha256 stream runs at
~0.7 GB/s on one core, so the 350M model with its AdamW state (5.6 GB) cost ~8 s per checkpoint to hash; the
tree costs that divided by the cores (16 on the H200 host: ~0.5 s) and detects the same corruption.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

FORMAT, VERSION = "packtrain.checkpoint", 2
HASH_CHUNK = 64 << 20
"""Bytes per piece of the checksum tree (`sha256_tree_file`)."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_tree_file(path: Path, chunk: int = HASH_CHUNK, workers: int | None = None) -> str:
    """sha256 of the concatenated sha256 digests of the file's `chunk`-byte pieces (an empty file: one empty
    piece), the pieces hashed by up to `workers` threads (None → the CPU count, at most 16)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    size = os.path.getsize(path)
    n = max(1, -(-size // chunk))
    fd = os.open(path, os.O_RDONLY)

    def piece(i: int) -> bytes:
        h, off = hashlib.sha256(), i * chunk
        left = min(chunk, size - off)
        while left > 0:
            b = os.pread(fd, min(left, 1 << 22), off)
            if not b:
                raise OSError(f"{path}: shorter than its {size} bytes while hashing")
            h.update(b)
            off, left = off + len(b), left - len(b)
        return h.digest()

    try:
        with ThreadPoolExecutor(max(1, min(n, workers or os.cpu_count() or 1, 16))) as ex:
            digests = list(ex.map(piece, range(n)))
    finally:
        os.close(fd)
    return hashlib.sha256(b"".join(digests)).hexdigest()


def build_manifest(root: Path, step: int, loss: float | None = None, eval_loss: float | None = None) -> dict:
    """manifest.json of checkpoint `step` for every file under `root` (manifest.json itself aside)."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            rel = p.relative_to(root).as_posix()
            files[rel] = {"bytes": p.stat().st_size, "sha256_tree": sha256_tree_file(p), "chunk_bytes": HASH_CHUNK}
    out = {"format": FORMAT, "version": VERSION, "step": step, "interval_loss": loss, "files": files}
    if eval_loss is not None:   # only with train.eval_every_steps: manifests stay as they were without it
        out["eval_loss"] = eval_loss
    return out


def manifest_loss(path: Path, key: str = "interval_loss") -> float | None:
    """`interval_loss` (or `key`: eval_loss) from a checkpoint's manifest (None when absent, unreadable or not
    finite)."""
    try:
        v = json.loads((path / "manifest.json").read_text()).get(key)
    except (OSError, ValueError):
        return None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def verify_checkpoint(path: Path) -> str | None:
    """None if `path` is complete and intact, else the reason (names the file)."""
    mf = path / "manifest.json"
    try:
        manifest = json.loads(mf.read_text())
    except FileNotFoundError:
        return "manifest.json is missing (partial write)"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"manifest.json is not valid JSON ({e})"
    except OSError as e:
        return f"manifest.json cannot be read ({e})"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        fmt = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        return f"manifest.json has format {fmt!r}, expected {FORMAT!r}"
    for rel, info in manifest["files"].items():
        f = path / rel
        tree = isinstance(info, dict) and {"bytes", "sha256_tree", "chunk_bytes"} <= set(info)
        if not tree and not (isinstance(info, dict) and {"bytes", "sha256"} <= set(info)):   # version 1: sha256
            return f"manifest.json entry for {rel} has no bytes/sha256_tree"
        if tree and not (isinstance(info["chunk_bytes"], int) and info["chunk_bytes"] > 0):
            return f"manifest.json entry for {rel} has chunk_bytes {info['chunk_bytes']!r} (a positive integer)"
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != info["bytes"]:
            return f"{rel} has {f.stat().st_size} bytes, manifest says {info['bytes']}"
        try:
            ok = (sha256_tree_file(f, int(info["chunk_bytes"])) == info["sha256_tree"] if tree
                  else sha256_file(f) == info["sha256"])
            if not ok:
                return f"{rel} fails its sha256 checksum"
        except OSError as e:
            return f"{rel} cannot be read ({e})"
    for required in ("state.json", "rng.pt"):
        if required not in manifest["files"]:
            return f"{required} is not in the manifest"
    return None
