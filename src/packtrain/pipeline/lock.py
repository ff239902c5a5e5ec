"""The workdir lock: one packtrain run (or stage command) writes into a workdir at a time.

    <workdir>/.packtrain.lock    {"pid": 4242, "host": "node-3", "command": "run", "started": "2026-12-01T05:02:11"}

`workdir_lock(workdir, command)` takes an exclusive `fcntl.flock` on that file for the duration of the
command. A second `packtrain run` in the same workdir stops at once with `WorkdirBusy` (exit 7) naming the
holder, instead of both writing the same stage outputs, log and champion alias. The kernel drops a flock when
its process dies (SIGKILL and OOM included), so a crash never leaves the workdir locked: the next command
takes the lock, sees the dead holder's record still in the file and says so on stderr ("stale lock ...
taken over"). The record is cleared on a clean exit.

Processes started by the holder (torchrun workers, kfp.local components, `packtrain` run from a
`packtrain run`) inherit PACKTRAIN_WORKDIR_LOCK=<workdir> and do not lock again. flock is per host: two
machines sharing a workdir over NFS are not serialised by it (give each its own workdir).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from packtrain.errors import WorkdirBusy

LOCK_NAME = ".packtrain.lock"
HELD_ENV = "PACKTRAIN_WORKDIR_LOCK"
"""Set (to the resolved workdir) while a process holds the lock; its children inherit it and skip locking."""


def _read_record(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        rec = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (UnicodeDecodeError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _describe(rec: dict | None) -> str:
    if not rec:
        return "another process (no record)"
    return (f"pid {rec.get('pid')} on {rec.get('host')} (`packtrain {rec.get('command')}`, started "
            f"{rec.get('started')})")


@contextlib.contextmanager
def workdir_lock(workdir: str | Path, command: str) -> Iterator[Path | None]:
    """Hold the workdir lock inside the block; yields the lock file (None when a parent process holds it)."""
    root = Path(workdir).resolve()
    if os.environ.get(HELD_ENV) == str(root):
        yield None
        return
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkdirBusy(f"workdir {root} is in use by {_describe(_read_record(fd))}: wait for it to "
                              f"finish, or use another workdir (--set workdir=DIR); lock file {path}") from None
        stale = _read_record(fd)
        if stale:
            print(f"note: stale lock in {path}: {_describe(stale)} ended without releasing it (crashed or "
                  "killed); taken over", file=sys.stderr)
        rec = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
               "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(rec).encode("utf-8"))
        os.fsync(fd)
        old = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = str(root)
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = old
            os.ftruncate(fd, 0)   # a clean exit leaves no record (a crash leaves one: "stale" next time)
    finally:
        os.close(fd)   # releases the flock
