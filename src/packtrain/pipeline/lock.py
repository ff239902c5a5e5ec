"""Two locks, one mechanism: a workdir is written by one packtrain run at a time, and so is an output directory.

    <workdir>/.packtrain.lock        {"pid": 4242, "host": "node-3", "command": "run", "started": "2026-12-01T05:02"}
    <parent>/.<name>.packtrain-lock  the same record, for the output directory <parent>/<name> (--out)

`workdir_lock(workdir, command)` takes an exclusive `fcntl.flock` on the first file for the duration of the
command. A second `packtrain run` in the same workdir stops at once with `WorkdirBusy` (exit 7) naming the
holder, instead of both writing the same stage outputs, log and champion alias.

`output_lock(out_dir, command)` does the same for one stage's output directory, which two runs in different
workdirs can still share (`packtrain train --out /shared/run` twice: without it both exit 0, one run's model,
checkpoints and log are lost and train_log.jsonl interleaves both). The train stage holds it for the whole
run (packtrain.stages.train), every stage that publishes a directory holds it while it builds and publishes
(packtrain.publish.staged_output), so the second run stops with `OutputBusy` (exit 7) naming the holder. Its
file sits *beside* the directory, not in it: publishing replaces the whole directory (a lock file inside would
be swapped away with it, and be a foreign entry to `check_replaceable`), and DVC and the stage cache hash the
directory's content. The path is resolved first (symlinks included), so two spellings of one directory share
one lock. Within one process the output lock is re-entrant (the train stage's run, then a publish into it).

The kernel drops a flock when its process dies (SIGKILL and OOM included), so a crash never leaves anything
locked: the next command takes the lock, sees the dead holder's record still in the file and says so on stderr
("stale lock ... taken over"). On release the workdir lock's record is cleared (the empty file stays) and an
output lock's file is removed, so a finished run leaves nothing beside its output (`_flock` says why that is
safe against a process that opened the file meanwhile).

Processes started by the holder of the workdir lock (torchrun workers, kfp.local components, `packtrain` run
from a `packtrain run`) inherit PACKTRAIN_WORKDIR_LOCK=<workdir> and do not lock again; the ranks of a `--gpus N`
launch do not take the output lock (the launching process holds it for them). flock is per host: two machines
sharing a directory over NFS are not serialised by it (give each its own workdir and output directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from packtrain.errors import OutputBusy, PacktrainError, WorkdirBusy

LOCK_NAME = ".packtrain.lock"
HELD_ENV = "PACKTRAIN_WORKDIR_LOCK"
"""Set (to the resolved workdir) while a process holds the lock; its children inherit it and skip locking."""
OUTPUT_LOCK_SUFFIX = ".packtrain-lock"
"""`<parent>/.<name>.packtrain-lock` locks the output directory `<parent>/<name>`."""
_held_outputs: set[str] = set()   # lock files of the output locks this process holds (re-entry yields None)


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
def _flock(path: Path, command: str, busy: Callable[[str], PacktrainError], remove: bool = False) -> Iterator[Path]:
    """Hold an exclusive flock on `path` with this process's record in it; `busy(holder)` is raised at once
    when another process holds it (`holder` as `_describe` words it). `remove`: delete the file on a clean
    release (while still holding it); a process that opened the old file meanwhile finds it unlinked once it
    gets the lock and starts over on a new one, so two processes never both hold `path`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read_record(fd))
            os.close(fd)
            raise busy(holder) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)   # locked a file its holder removed on release: lock the one at `path` now
    try:
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
        yield path
    finally:   # a release leaves no record (a crash leaves one: "stale" next time)
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)   # while still holding it
        else:
            os.ftruncate(fd, 0)
        os.close(fd)   # releases the flock


@contextlib.contextmanager
def workdir_lock(workdir: str | Path, command: str) -> Iterator[Path | None]:
    """Hold the workdir lock inside the block; yields the lock file (None when a parent process holds it)."""
    root = Path(workdir).resolve()
    if os.environ.get(HELD_ENV) == str(root):
        yield None
        return
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME

    def busy(holder: str) -> WorkdirBusy:
        return WorkdirBusy(f"workdir {root} is in use by {holder}: wait for it to finish, or use another workdir "
                           f"(--set workdir=DIR); lock file {path}")

    with _flock(path, command, busy):
        old = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = str(root)
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = old


def output_lock_path(out_dir: str | Path) -> Path:
    """The lock file of an output directory: beside it, named after it, symlinks resolved.

    >>> output_lock_path("/tmp/runs/train").name
    '.train.packtrain-lock'
    """
    real = Path(os.path.realpath(out_dir))
    return real.parent / f".{real.name}{OUTPUT_LOCK_SUFFIX}"


@contextlib.contextmanager
def output_lock(out_dir: str | Path, command: str) -> Iterator[Path | None]:
    """Hold the lock of output directory `out_dir` inside the block (OutputBusy, exit 7, when another process
    holds it); yields the lock file, or None when this process already holds it."""
    real = Path(os.path.realpath(out_dir))
    path = output_lock_path(real)
    if str(path) in _held_outputs:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)

    def busy(holder: str) -> OutputBusy:
        return OutputBusy(f"output directory {real} is in use by {holder}: two runs writing one output directory "
                          "would mix their files and lose one run's result; wait for it to finish, or write to "
                          f"another output directory (--out DIR); lock file {path}")

    with _flock(path, command, busy, remove=True):
        _held_outputs.add(str(path))
        try:
            yield path
        finally:
            _held_outputs.discard(str(path))


@contextlib.contextmanager
def buffer_lock(buffer_dir: str | Path, command: str) -> Iterator[Path]:
    """Hold the lock of an MLflow buffer directory while `packtrain mlflow replay` applies it (OutputBusy, exit 7,
    when another replay of the same buffer holds it). The lock file sits beside the buffer, like an output lock
    (`<parent>/.<name>.packtrain-lock`): a replay locks the buffer it reads and writes, never the workdir of the
    folder it was started from, so replays of unrelated buffers never stop each other."""
    real = Path(os.path.realpath(buffer_dir))
    path = output_lock_path(real)
    path.parent.mkdir(parents=True, exist_ok=True)

    def busy(holder: str) -> OutputBusy:
        return OutputBusy(f"MLflow buffer {real} is being replayed by {holder}: wait for it to finish (each op "
                          f"is applied once either way); lock file {path}")

    with _flock(path, command, busy, remove=True):
        yield path
