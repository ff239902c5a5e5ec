"""Atomic publishing: a file by temp file + rename, a directory (a stage's outputs) by staging + one swap.

The publish rule (every stage: ingest, validate, tokenize, pack, evaluate): a stage writes all of its outputs
into a staging directory next to its output directory, checks them, and only then publishes them as one unit
(`staged_output` → `publish_dir`: fsync, then one atomic swap of the directories). A stage that fails — a bad
input, a failed check, an exception, even `kill -9` at any point — leaves the previous output directory
byte-identical; one that succeeds replaces it whole. Leftover staging directories
(`.<stage>.packtrain-new-<pid>-…`) are never read as output and are removed by the next run. Because the
whole directory is replaced, a stage refuses an output directory holding files that are not its own.

    atomic_write_text(path, text) / write_json(path, obj)   a file: fsynced temp file, then rename
    atomic_copy_file(src, dst)                              a copy of a file, the same way
    staged_output(dst, outputs, what)                       a stage's directory: build in `tmp`, check, publish
    staging_dir(dst) + publish_dir(tmp, dst)                the same, by hand (stores, downloads, the stage cache)

The one owner of the temp-then-rename pattern.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import re
import secrets
import shutil
import signal
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from packtrain.errors import ConfigError, PacktrainError


def atomic_write_text(path: Path, text: str) -> None:
    """Write via temp file (fsynced) + rename so a crash never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def atomic_copy_file(src: Path, dst: Path) -> None:
    """Copy `src` to `dst` through an fsynced temp file beside it (`.<name>.<pid>.part`) and a rename: `dst` is
    the whole copy or what it was before; the temp file is removed when the copy fails (OSError raised)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(dst)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    import json

    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


# -- publishing a stage's outputs -------------------------------------------------------------------------
FAULT_ENV = "PACKTRAIN_FAULT"
STAGING_TAG = ".packtrain-"
"""Staging names: `.<name>.packtrain-new-<pid>-<random>` (being built, or holding the swapped-out previous
copy) and `.<name>.packtrain-old-<pid>-<random>` (the previous copy, fallback publish only)."""
_STAGING_RE = re.compile(r"\.packtrain-(new|old)-(\d+)-[0-9a-f]+")
_LEGACY = (".tmp", ".old")   # `.<name>.tmp` / `.<name>.old`: the names the replace_dir of earlier versions used
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
_fault_counter = itertools.count()


def output_target(dst: str | Path) -> Path:
    """Where `dst`'s content really lives: an output directory that is a symbolic link is published at its
    target (the link stays; the staging directory sits next to the target, on its filesystem)."""
    dst = Path(dst)
    return Path(os.path.realpath(dst)) if dst.is_symlink() else dst


def check_replaceable(dst: Path, outputs: Iterable[str] | None, what: str = "output") -> None:
    """Refuse (ConfigError, exit 2) to publish over `dst` when publishing would delete something that is not an
    output of this stage: `dst` is a file, a mount point, or holds an entry not named in `outputs` (or a
    `.<output>.tmp` leftover of an earlier version). `outputs=None` skips the entry check."""
    if not os.path.lexists(dst):
        return
    if not dst.is_dir():
        raise ConfigError(f"{what} output {dst} exists and is not a directory: pass a directory (new or holding "
                          f"an earlier {what} output) as the output")
    if os.path.ismount(dst):
        raise ConfigError(f"{what} output {dst} is a mount point, which cannot be replaced by a rename: pass a "
                          "directory below it")
    if outputs is None:
        return
    allowed = set(outputs) | {f".{o}.tmp" for o in outputs}
    foreign = sorted(e for e in os.listdir(dst) if e not in allowed)
    if foreign:
        shown = ", ".join(foreign[:10]) + (f", ... ({len(foreign) - 10} more)" if len(foreign) > 10 else "")
        raise ConfigError(
            f"{what} output directory {dst} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} that "
            f"{'is' if len(foreign) == 1 else 'are'} not {what} output ({shown}; {what} writes "
            f"{', '.join(outputs)}); publishing replaces the whole directory, so packtrain will not: move them "
            "away or choose a new or empty output directory")


def staging_dir(dst: str | Path) -> Path:
    """A new empty directory next to `dst` to build its next version in (stale ones are cleaned first)."""
    dst = output_target(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(dst)
    while True:   # os.mkdir, not tempfile.mkdtemp: the published directory gets the usual umask mode, not 0700
        path = dst.with_name(f".{dst.name}{STAGING_TAG}new-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def clean_stale(dst: str | Path) -> list[Path]:
    """Tidy what a killed publish of `dst` left next to it; returns the paths removed or restored.

    Staging directories of processes that are gone are removed (never read as output). If a kill hit the
    fallback publish between its two renames (`dst` missing, the previous copy under its `.packtrain-old`
    name), that copy is renamed back to `dst` first. Entries of a live process (another run publishing the
    same output, or this one) are left alone.
    """
    dst = Path(dst)
    parent = dst.parent
    if not parent.is_dir():
        return []
    prefix = f".{dst.name}"
    new: list[Path] = []
    old: list[Path] = []
    for name in sorted(os.listdir(parent)):
        if not name.startswith(prefix):
            continue
        rest, path = name[len(prefix):], parent / name
        m = _STAGING_RE.fullmatch(rest)
        if m and not _alive(int(m.group(2))):
            (old if m.group(1) == "old" else new).append(path)
        elif rest in _LEGACY and path.is_dir() and not path.is_symlink():
            (old if rest == ".old" else new).append(path)
    done = []
    if old and not os.path.lexists(dst):
        back = old.pop()
        os.rename(back, dst)
        print(f"warning: {dst} was missing after an interrupted publish; restored the previous copy from "
              f"{back.name}", file=sys.stderr)
        done.append(dst)
    for path in new + old:
        shutil.rmtree(path, ignore_errors=True)
        done.append(path)
    return done


def publish_dir(tmp: str | Path, dst: str | Path, outputs: Iterable[str] | None = None,
                what: str = "output") -> None:
    """Replace `dst` by the finished directory `tmp` (made by `staging_dir(dst)`) as one unit.

    Steps: fsync every file of `tmp`; then, if `dst` does not exist, rename `tmp` to `dst`; else swap the two
    in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`) and delete the previous copy, now under the
    staging name. Where the swap is not supported (other kernels, some network filesystems) it takes two
    renames, `dst` → `.packtrain-old-…` then `tmp` → `dst`; a kill between them is repaired by the next
    `staging_dir(dst)` (clean_stale puts the previous copy back). Readers see the old or the new directory,
    never a mix. `outputs`/`what`: see check_replaceable. The deletion of the previous copy is the explicit
    replacement by a successful run; if it fails the new output stays published and a warning names the
    leftover, which the next run removes.

    Test hook: PACKTRAIN_FAULT (comma-separated) with `publish@N` SIGKILLs this process at the N-th publish
    point it reaches (0-based, counted over the whole process), `publish.raise@N` raises OSError there, and
    `publish.no_exchange` forces the two-rename fallback. Each point it fires at is printed to stderr as
    `PACKTRAIN_FAULT publish@N: <point> of <dst>`. Points, in order: `staged` (before the fsync), `synced`,
    `moved-old` (fallback only: previous copy renamed away, `dst` missing), `swapped` (the new output is in
    place), `removing-old` (after the first entry of the previous copy was deleted). ':' works for '@'.
    Never set outside tests.
    """
    tmp, dst = Path(tmp), output_target(dst)
    _fault_point("staged", dst)
    _fsync_tree(tmp)
    _fault_point("synced", dst)
    if not os.path.lexists(dst):
        os.rename(tmp, dst)   # atomic; a non-empty directory that appeared there meanwhile makes it fail
        _fsync_dir(dst.parent)
        return
    check_replaceable(dst, outputs, what)
    os.chmod(tmp, stat.S_IMODE(os.stat(dst).st_mode))   # keep the mode the output directory had
    if _exchange(tmp, dst):
        old = tmp             # the swap left the previous copy under the staging name
    else:
        old = dst.with_name(f".{dst.name}{STAGING_TAG}old-{os.getpid()}-{secrets.token_hex(4)}")
        os.rename(dst, old)
        try:
            _fault_point("moved-old", dst)
            os.rename(tmp, dst)
        except BaseException:
            os.rename(old, dst)
            raise
    try:   # from here the new output is published: nothing below may report the publish as failed
        _fsync_dir(dst.parent)
        _fault_point("swapped", dst)
        _remove_previous(old, dst)
    except Exception as e:  # the new output is published: a leftover is only untidy (the next run removes it)
        print(f"warning: published {dst}, but could not remove the previous copy {old}: {e}", file=sys.stderr)


@contextlib.contextmanager
def staged_output(dst: str | Path, outputs: Sequence[str] | None = None, what: str = "output",
                  required: Iterable[str] | None = None) -> Iterator[Path]:
    """Build a stage's outputs in a staging directory; publish them as one unit when the block succeeds.

        with staged_output(out, ("documents.parquet", "ingest_result.json"), "ingest") as tmp:
            ...  # write every output into tmp, check it; raise to abandon
        # here `out` holds exactly the new outputs; after an exception or a kill it is byte-identical to before

    `outputs`: the names the stage writes; a `dst` holding anything else is refused up front (ConfigError)
    because publishing replaces the whole directory. `required` (default: all `outputs`) must exist in tmp
    when the block ends, else nothing is published. The staging directory never outlives the block. An OS
    error while publishing (disk full, I/O) becomes a PacktrainError (exit 1) saying `dst` is unchanged. The
    block holds `dst`'s output lock (packtrain.pipeline.lock.output_lock): a second run building the same
    output directory meanwhile, from any workdir, stops at once with OutputBusy (exit 7) naming this one.
    """
    from packtrain.pipeline.lock import output_lock

    dst = output_target(dst)
    check_replaceable(dst, outputs, what)
    with contextlib.ExitStack() as held:
        try:   # another run building the same output: OutputBusy (exit 7) naming it
            held.enter_context(output_lock(dst, what))
            tmp = staging_dir(dst)
        except OSError as e:
            raise PacktrainError(f"{what}: cannot create a staging directory next to {dst} ({e.strerror or e}): "
                                 "outputs are built beside the output directory, so its parent must be "
                                 "writable") from e
        try:
            yield tmp
            need = list(outputs or ()) if required is None else list(required)
            missing = [n for n in need if not os.path.lexists(tmp / n)]
            if missing:
                raise PacktrainError(f"{what}: {', '.join(missing)} not written; nothing was published to {dst}")
            try:
                publish_dir(tmp, dst, outputs, what)
            except OSError as e:   # raised only before the commit (see publish_dir): dst is untouched
                raise PacktrainError(f"{what}: publishing {dst} failed ({e}); it is as it was before this "
                                     "run") from e
        finally:
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: Path, root: Path) -> None:
    """Move a finished temp directory into place, replacing `root` as one unit (`publish_dir` without the
    output-name check), so readers never see a half-written directory."""
    publish_dir(tmp, root)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, so a published directory survives a power loss whole."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_dir(dirpath)


@functools.cache
def _renameat2():
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):   # not Linux / glibc < 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the kernel, libc or filesystem cannot."""
    fn = None if _fault_active("publish.no_exchange") else _renameat2()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _remove_previous(old: Path, dst: Path) -> None:
    for i, entry in enumerate(sorted(old.iterdir())):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        if i == 0:
            _fault_point("removing-old", dst)
    old.rmdir()


def _fault_active(token: str) -> bool:
    spec = os.environ.get(FAULT_ENV)
    return bool(spec) and token in (t.strip() for t in (spec or "").split(","))


def _fault_point(point: str, dst: Path) -> None:
    """The publish test hook (see publish_dir); costs one environment lookup when PACKTRAIN_FAULT is unset."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    i = next(_fault_counter)
    for token in spec.split(","):
        kind, sep, n = token.strip().replace(":", "@").partition("@")
        if sep and kind in ("publish", "publish.raise") and n.isdigit() and int(n) == i:
            print(f"PACKTRAIN_FAULT {kind}@{i}: {point} of {dst}", file=sys.stderr, flush=True)
            if kind == "publish":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.EIO, f"injected fault {kind}@{i} at publish point {point!r}", str(dst))
