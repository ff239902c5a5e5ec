"""Replaying a buffer directory: every op applied exactly once, whatever crashes or copies happen.

    replay_files(buffer_dir, open_client=BufferedClient)   every unlocked *.jsonl, oldest first, to the store
                                                each op was recorded for; fully applied files are deleted
    replay_files(buffer_dir, tracking_uri=URI, open_client=...)   everything to URI (which may carry the
                                                credentials)
    recorded_uris(buffer_dir)                   {"https://user:***@host": 12, ...}: ops not yet applied

The clients the ops go through are packtrain.tracking.buffer.BufferedClient, which imports this module to
replay its own backlog; so this module never imports it: a caller passes `open_client` (the public entry,
`packtrain.tracking.replay_dir`, is packtrain.tracking.buffer.replay_dir, which passes BufferedClient).

Per op: skip it if its id is in applied.log → apply it → record its id (fsync) → delete the buffer's copy
of its file. A kill between "applied" and "recorded" re-applies one op on the next replay, which the store
absorbs (packtrain.tracking.store_ops). The first transient failure in a file (store unreachable, or a run whose
create_run is in a later file) keeps the rest of that file for the next pass or replay; an op the store
refuses goes to rejected.jsonl and never blocks the others. So does an op whose file path leads outside the
buffer's artifacts/ after resolving `..` and symbolic links (packtrain.tracking.store_ops.buffered_file): it is
refused before anything is sent, listed in `refused` with the buffer file, line, path and what is allowed,
and nothing it names is uploaded or deleted.

Credentials: ops record the redacted URI. An op recorded for `https://user:***@host` is sent to
`https://host` with MLflow's MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN,
or ~/.mlflow/credentials); without them it is left in the buffer and listed in `needs_credentials`.

Fault points for tests (PACKTRAIN_FAULT, see packtrain.faults; never set outside tests):
`replay.before_record@N` SIGKILLs the replaying process right after the store applied its N-th op, before
the op id is on disk (the worst moment); `replay.after_record@N` right after the id is on disk.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.paths import PathOutsideError, confined_path
from packtrain.secrets import MASK, has_userinfo, redact_text, strip_userinfo
from packtrain.tracking.ledger import (
    APPLIED,
    REJECTED,
    RUN_IDS,
    RUN_IDS_LOCK,
    AppliedLog,
    read_numbered_ops,
    read_ops,
    reject,
)
from packtrain.tracking.store_ops import buffered_file, drop_copy
from packtrain.tracking.transport import is_transient, short_http

log = logging.getLogger(__name__)
_applied_in_process = 0  # counts ops this process applied during replays (fault points only)


@dataclass
class ReplayResult:
    applied: int = 0
    left: int = 0
    rejected: int = 0
    files: int = 0
    skipped_locked: list[str] = field(default_factory=list)
    needs_credentials: list[str] = field(default_factory=list)   # redacted URIs whose ops wait for them
    registered: list[dict] = field(default_factory=list)         # results of replayed register_model ops
    refused: list[str] = field(default_factory=list)   # ops whose path leads outside the buffer: one message each

    def add(self, other: ReplayResult) -> None:
        self.applied += other.applied
        self.left += other.left
        self.rejected += other.rejected
        self.files += other.files
        self.skipped_locked += other.skipped_locked
        self.needs_credentials += [u for u in other.needs_credentials if u not in self.needs_credentials]
        self.registered += other.registered
        self.refused += other.refused


def _fault(point: str) -> None:
    if os.environ.get("PACKTRAIN_FAULT"):
        from packtrain.faults import kill_point

        kill_point(f"{point}@{_applied_in_process}")


def replay_file(bc, fh, name: str, only_uri: str | None = None) -> ReplayResult:
    """Apply the not-yet-applied ops of the locked file `fh` through BufferedClient `bc`, in order.

    Only ops recorded for `only_uri` when given (others are left untouched). `left` counts this call's
    ops that are still to apply.
    """
    global _applied_in_process
    fh.seek(0)
    ops, bad = read_numbered_ops(fh.read(), name)
    for line in bad:
        reject(bc.buffer_dir, None, "unreadable line in a buffer file", raw=line)
    res = ReplayResult()
    blocked = False
    for line_no, op in ops:
        if only_uri is not None and op.get("uri") != only_uri:
            continue
        if op["id"] in bc.applied:
            drop_copy(bc.buffer_dir, op)  # a replay killed between recording the id and this
            continue
        if blocked:
            res.left += 1
            continue
        refusal = _path_refusal(bc.buffer_dir, op, Path(bc.buffer_dir) / name, line_no)
        if refusal is not None:   # never applied, never retried (it cannot get better): kept in rejected.jsonl
            res.rejected += 1
            res.refused.append(refusal)   # said by the caller (the CLI prints it; a live client logs it)
            reject(bc.buffer_dir, op, refusal)
            bc.applied.record(op["id"])
            continue
        try:
            result = bc._apply(op)
        except Exception as e:
            if is_transient(e):
                blocked = True
                res.left += 1
                continue
            res.rejected += 1
            msg = redact_text(str(e))
            log.warning("MLflow rejected a buffered %s op (%s): moved to %s", op.get("op"), msg[:300], REJECTED)
            reject(bc.buffer_dir, op, msg)
        else:
            res.applied += 1
            _applied_in_process += 1
            if op["op"] == "register_model" and isinstance(result, dict):
                res.registered.append({k: result.get(k) for k in ("model_name", "version", "decision",
                                                                  "champion_version", "reason")})
        _fault("replay.before_record")
        bc.applied.record(op["id"])
        _fault("replay.after_record")
        drop_copy(bc.buffer_dir, op)
    return res


def _path_refusal(buffer_dir: Path, op: dict, file: Path, line_no: int) -> str | None:
    """Why the op on line `line_no` of buffer file `file` is refused (a path it names leads outside the
    buffer's artifacts/: packtrain.tracking.store_ops.buffered_file), or None."""
    if not (op.get("path") or op.get("buffered_path")):
        return None
    try:
        buffered_file(buffer_dir, op)
    except PathOutsideError as e:
        return (f"{file}:{line_no}: {op.get('op')} op {op['id']} refused: {e}. Nothing was uploaded for this "
                f"line and nothing outside the buffer was touched; the line is kept in {REJECTED}")
    return None


def target_for(recorded: str) -> str | None:
    """Where to send ops recorded for `recorded` (a redacted URI); None when credentials are needed and
    none are configured."""
    if not recorded:
        return None
    if not has_userinfo(recorded):
        return recorded
    userinfo = recorded.split("://", 1)[1].split("@", 1)[0]
    if MASK not in userinfo:  # recorded before packtrain redacted URIs: it carries its own credentials
        return recorded
    return strip_userinfo(recorded) if _have_credentials() else None


def _have_credentials() -> bool:
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return True
    try:
        from mlflow.utils.credentials import read_mlflow_creds

        creds = read_mlflow_creds()   # MLFLOW_TRACKING_USERNAME/PASSWORD, else ~/.mlflow/credentials
        return bool(creds.username and creds.password)
    except Exception:
        return bool(os.environ.get("MLFLOW_TRACKING_USERNAME") and os.environ.get("MLFLOW_TRACKING_PASSWORD"))


def _buffer_files(buffer_dir: Path) -> list[Path]:
    return sorted(p for p in Path(buffer_dir).glob("*.jsonl") if p.name != REJECTED)


def _check_own_files(buffer_dir: Path) -> None:
    """The files a replay appends to, rewrites or deletes (applied.log, rejected.jsonl, run_ids.json, the
    *.jsonl files) must not be symbolic links leading out of the buffer (an append through one would write
    into the file it points at): PathOutsideError (exit 3) before anything is read or sent."""
    names = [APPLIED, REJECTED, RUN_IDS, RUN_IDS_LOCK] + [p.name for p in Path(buffer_dir).glob("*.jsonl")]
    for name in names:
        path = Path(buffer_dir) / name
        if path.is_symlink():
            confined_path(path, buffer_dir, f"buffer file {name} (a symbolic link)",
                          f"a file inside {Path(buffer_dir).resolve()}; nothing was replayed")


def recorded_uris(buffer_dir: str | Path) -> dict[str, int]:
    """{redacted URI: ops not applied yet} over every buffer file (read without taking the locks)."""
    applied = AppliedLog(Path(buffer_dir))
    out: dict[str, int] = {}
    for path in _buffer_files(Path(buffer_dir)):
        try:
            ops, _ = read_ops(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        for op in ops:
            if op["id"] not in applied:
                out[op.get("uri") or ""] = out.get(op.get("uri") or "", 0) + 1
    return out


def replay_files(buffer_dir: str | Path, tracking_uri: str | None = None, client=None,
                 open_client: Callable[[str, Path], Any] | None = None) -> ReplayResult:
    """Replay every unlocked buffer file in `buffer_dir`, oldest first; fully applied files are deleted.

    Ops go to the store they were recorded for (see `target_for`), or all to `tracking_uri` when given.
    Passes repeat while they make progress (a child run may wait for its parent's create_run in a later
    file). With `client` (the in-process replay of a live BufferedClient) only ops recorded for that
    client's store are replayed, once. Files locked by a live process are skipped and listed in
    `skipped_locked`. When no buffer file is left, applied.log is emptied. Without `client`, the ops of each
    store go through `open_client(store_uri, buffer_dir)` (a BufferedClient), one per store.
    """
    if (client is None) == (open_client is None):
        raise TypeError("replay_files: give exactly one of client= and open_client=")
    buffer_dir = Path(buffer_dir)
    if client is None:
        _check_own_files(buffer_dir)
    ledger = AppliedLog(buffer_dir)
    clients: dict[str, Any] = {}
    grand = ReplayResult()
    for n_pass in range(10):
        total = ReplayResult()
        for path in _buffer_files(buffer_dir):
            if client is not None and path == client._own_path:
                continue
            try:
                fh = open(path, "r+", encoding="utf-8")  # noqa: SIM115 - closed below
            except FileNotFoundError:  # another replayer finished it meanwhile
                continue
            with fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    total.skipped_locked.append(path.name)
                    continue
                if not path.exists():
                    continue
                ops, _ = read_ops(fh.read())
                res = ReplayResult(files=1)
                for uri in [None] if tracking_uri else sorted({op.get("uri") or "" for op in ops}):
                    if client is not None:
                        if uri != client.shown_uri:
                            continue
                        bc = client
                    else:
                        target = tracking_uri or target_for(uri or "")   # (uri is a str without tracking_uri)
                        if target is None:
                            res.needs_credentials.append(uri or "")
                            continue
                        if target not in clients:
                            assert open_client is not None   # checked above: no client → open_client
                            clients[target] = open_client(target, buffer_dir)
                        bc = clients[target]
                    with short_http(bc.uri, None):
                        part = replay_file(bc, fh, path.name, only_uri=uri)
                    res.applied += part.applied
                    res.rejected += part.rejected
                    res.registered += part.registered
                    res.refused += part.refused
                res.left = sum(1 for op in ops if op["id"] not in ledger)
                if res.left == 0:
                    path.unlink(missing_ok=True)
                total.add(res)
        grand.applied += total.applied
        grand.rejected += total.rejected
        grand.registered += total.registered
        grand.refused += total.refused
        grand.files = max(grand.files, total.files) if n_pass else total.files
        grand.left, grand.skipped_locked = total.left, total.skipped_locked
        grand.needs_credentials = total.needs_credentials
        if client is not None or total.applied == 0 or total.left == 0:
            break
    if not _buffer_files(buffer_dir) and ledger.path.exists():
        ledger.compact()
    return grand
