"""What a buffer directory remembers across processes, crashes and copies: applied op ids and run ids.

    <buffer_dir>/applied.log     one op id per line, appended (O_APPEND + fsync) the moment its op applied
    <buffer_dir>/run_ids.json    {"pending-3f2a…": "<real run id>"}, rewritten atomically (tmp + rename)
    <buffer_dir>/rejected.jsonl  ops the store refused (bad request), with the error; kept for a human

Replay skips every op whose id is in applied.log, so a replay killed after op k and started again resumes
at op k+1; the window between "the store applied op k" and "k's id is on disk" (one fsync, ~1 ms) is
covered by the store side being idempotent too (packtrain.tracking.store_ops). A copy of the buffer directory
carries its applied.log. Ops written before ids existed get a stable id from their content (`op_id`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)
APPLIED = "applied.log"
REJECTED = "rejected.jsonl"
RUN_IDS = "run_ids.json"
RUN_IDS_LOCK = "run_ids.lock"
_ID = re.compile(r"^[0-9a-f]{32}$")


def op_id(op: dict) -> str:
    """The op's own id, or (ops recorded before ids existed) the first 32 hex of sha256 of its JSON."""
    oid = op.get("id")
    if isinstance(oid, str) and _ID.match(oid):
        return oid
    blob = json.dumps({k: v for k, v in op.items() if k != "id"}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def read_ops(text: str, source: str = "") -> tuple[list[dict], list[str]]:
    """(ops, bad lines) of a buffer file's text. A torn last line (the writer was killed mid-write) and
    any line that is not a JSON object are returned as bad lines, never raised."""
    numbered, bad = read_numbered_ops(text, source)
    return [op for _, op in numbered], bad


def read_numbered_ops(text: str, source: str = "") -> tuple[list[tuple[int, dict]], list[str]]:
    """`read_ops` with each op's line number (1-based) in the file, for messages that name the line."""
    ops, bad = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            op = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(op, dict) or "op" not in op:
            bad.append(line)
            continue
        op["id"] = op_id(op)
        ops.append((n, op))
    if bad:
        log.warning("%s: %d unreadable line(s) (a write cut short by a crash?) moved to %s", source or "buffer",
                    len(bad), REJECTED)
    return ops, bad


class AppliedLog:
    """The set of applied op ids of one buffer directory, backed by the append-only applied.log."""

    def __init__(self, buffer_dir: Path):
        self.path = Path(buffer_dir) / APPLIED
        self._ids: set[str] = set()
        self._size = -1

    def load(self) -> set[str]:
        """Re-read the file when another process appended to it since the last read."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self._ids, self._size = set(), 0
            return self._ids
        if size != self._size:
            text = self.path.read_text(encoding="utf-8", errors="replace")
            self._ids = {ln for ln in text.splitlines() if _ID.match(ln)}  # a torn line matches nothing
            self._size = size
        return self._ids

    def __contains__(self, oid: str) -> bool:
        return oid in self._ids or oid in self.load()

    def record(self, oid: str) -> None:
        """Append `oid` and fsync before returning: once this returns the op is never applied again."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            prefix = b""
            if end:  # a previous writer killed mid-line: start on a fresh line
                with open(self.path, "rb") as f:
                    f.seek(end - 1)
                    prefix = b"" if f.read(1) == b"\n" else b"\n"
            os.write(fd, prefix + oid.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self._ids.add(oid)

    def compact(self) -> None:
        """Forget every id (called when no buffer file is left: no op in this directory can come back)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._ids, self._size = set(), 0


def reject(buffer_dir: Path, op: dict | None, error: str, raw: str | None = None) -> None:
    """Append a refused op (or an unreadable line) to rejected.jsonl, once per op id."""
    path = Path(buffer_dir) / REJECTED
    key = f'"id": "{op["id"]}"' if op is not None else json.dumps({"raw": raw})[1:-1]
    with contextlib.suppress(OSError):
        if key in path.read_text(encoding="utf-8"):
            return
    rec = {**op, "error": error[:500]} if op is not None else {"raw": raw, "error": error}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_ids(buffer_dir: Path) -> dict[str, str]:
    try:
        return json.loads((Path(buffer_dir) / RUN_IDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_id(buffer_dir: Path, pending: str, real: str) -> None:
    """Record pending → real under a lock; tmp + fsync + rename, so a crash leaves the old or the new map."""
    buffer_dir = Path(buffer_dir)
    buffer_dir.mkdir(parents=True, exist_ok=True)
    with open(buffer_dir / RUN_IDS_LOCK, "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        ids = read_ids(buffer_dir)
        if ids.get(pending) == real:
            return
        ids[pending] = real
        from packtrain.publish import atomic_write_text

        atomic_write_text(buffer_dir / RUN_IDS, json.dumps(ids, indent=1))
