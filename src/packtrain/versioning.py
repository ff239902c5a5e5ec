"""DVC helpers: the md5 DVC records for a path, the git revision, the DVC repo holding a path, its default
remote, push.

`data_md5` builds DVC's own directory listing (`dvc_data`) from each file's md5 (hashlib, in large reads:
`CHUNK`), so it is exactly what `dvc add` writes into `.dvc` files and `dvc repro` into `dvc.lock`:

    file       md5 of the bytes                                   'bbe02f946d5455d74616fc9777557c22'
    directory  md5 of DVC's JSON listing [{"md5", "relpath"}...]   '894677b4e0c9ba24aaecbcaa60233674.dir'
               (sorted by relpath; `.git`, `.hg`, `.dvc` entries ignored as DVC does; a `.dvcignore` of an
               enclosing repo is not applied)

Stage runners put the md5 of what they read into their stats (`input_md5`), tag their MLflow run
`dvc.md5.<name>` and log it as the digest of an MLflow dataset input, so a run can be traced to the exact
data version. dvc/dvc_data are imported inside the functions (≈0.1 s).

This module is the one owner of the versions a result records (packtrain.stages.results.Lineage):
`git_sha` (the one `git rev-parse HEAD` lookup), `code_version`, `file_md5` / `data_md5` (the stage cache
hashes its inputs with `data_md5(..., skip_hidden=True)`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packtrain.errors import MissingDataError, PacktrainError

DVC_IGNORED = frozenset({".git", ".hg", ".dvc"})


def _fs():
    from dvc_objects.fs.local import LocalFileSystem

    return LocalFileSystem()


CHUNK = 8 << 20
"""Bytes read per call when hashing, into one reused buffer: each call hands the GIL back and forth twice
(read, update), and a thread that wants it back waits up to the switch interval (5 ms) while another thread
runs Python. 700 MB hashed on a thread beside a main thread running Python (hash_ahead: the evaluate stage
scoring while the downloaded champion is hashed, the train stage's tail while its model is): on an H100 host's
CPU 8.4 s in 1 MiB reads, 2.2 s in 8 MiB, 1.5 s in 32 MiB, 1.3 s alone whatever the size; on the 2-core CPU
machine 32 MiB costs 0.3 s more CPU than 8 MiB or less (the buffer no longer fits its cache)."""


_HASHED: dict[tuple, Any] = {}
"""Hashes computed in this process, by (device, inode, size, mtime, ctime): what DVC's own state database keys
on. One `packtrain run` hashes the same model directory for the stage cache, lineage, the evaluate identity and
the registered version's tag (~1.2 s per 700 MB each time, ~10 times a run); a file changed since gets a new
entry."""

SETTLE_NS = 50_000_000
"""A file whose timestamps carry sub-second digits is memoized once its mtime is this old: its file system
stamps at least every jiffy (≤ 10 ms), so any later write gives it another mtime."""
COARSE_SETTLE_NS = 2_000_000_000
"""… and one whose mtime is a whole second (FAT's 2 s, ext3's or a network file system's 1 s stamps): 2 s."""


def _settle_ns(mtime_ns: int) -> int:
    """How old a file with this mtime must be before its md5 is memoized (SETTLE_NS / COARSE_SETTLE_NS)."""
    return COARSE_SETTLE_NS if mtime_ns % 1_000_000_000 == 0 else SETTLE_NS


def _stat_key(path: str | Path, kind: str) -> tuple | None:
    """The memo key of a file, None while its mtime is too fresh to trust: a rewrite of the same size within the
    file system's timestamp granularity would keep the key (git's "racy" rule). A model saved a second ago by the
    train stage is therefore hashed once, not once per reader."""
    import time

    st = os.stat(path)
    settle = _settle_ns(st.st_mtime_ns)
    if time.time_ns() - st.st_mtime_ns < settle:
        return None
    return (kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_md5(path: str | Path) -> str:
    """DVC md5 of one file: in DVC 3 the plain md5 of its bytes (no dos2unix), read `CHUNK` at a time
    (~0.2 s per 100 MB; once per file version in a process: `_HASHED`). `file_md5(p) == hash_file(p, fs,
    "md5")[1].value` of dvc_data (tests check it)."""
    key = _stat_key(path, "md5")
    if key is not None and key in _HASHED:
        return _HASHED[key]
    digest = _file_md5(path)
    if key is not None:
        _HASHED[key] = digest
    return digest


def _file_md5(path: str | Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(max(1, min(CHUNK, os.fstat(f.fileno()).st_size)))   # a small file: a small buffer
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _dvc_hashed(path: str | Path, fs) -> tuple:
    """(Meta, HashInfo) of one file, as dvc_data's `hash_file(path, fs, "md5")` gives them for a local file
    (the same meta from `fs.info`, the md5 of its bytes), the bytes read by `_file_md5` (`CHUNK`)."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta

    meta = Meta.from_info(fs.info(str(path)), fs.protocol)
    return meta, HashInfo("md5", _file_md5(path))


def files_md5(files: Mapping[str, str | Path]) -> str:
    """DVC `.dir` md5 of a virtual directory whose entry `relpath` holds the bytes of `files[relpath]`.

    Equals `data_md5(d)` for a directory `d` laid out like that; used for the default corpus, whose files
    are a selection from the standard library, not a whole directory.
    """
    from dvc_data.hashfile.tree import Tree

    fs = _fs()
    tree = Tree()
    for rel, path in files.items():
        key = _stat_key(path, "dvc")
        hashed = _HASHED.get(key) if key is not None else None
        if hashed is None:
            hashed = _dvc_hashed(path, fs)
            if key is not None:
                _HASHED[key] = hashed
        meta, info = hashed
        tree.add(tuple(rel.split("/")), meta, info)
    tree.digest()
    return tree.hash_info.value


def data_md5(path: str | Path, skip_hidden: bool = False) -> str:
    """The md5 DVC records for `path`: a file's md5, or a directory's `<md5>.dir`. `skip_hidden` also leaves
    out every entry whose name starts with "." (leftover `.x.tmp` files, staging dirs: never stage outputs).

    >>> data_md5("data/ingest/documents.parquet")   # doctest: +SKIP
    '3f1c...'
    >>> data_md5("data/ingest")                     # doctest: +SKIP
    '9a2b....dir'
    """
    p = Path(path)
    if _AHEAD:   # a hash started ahead (hash_ahead): wait for it, then every file's md5 is in the memo
        ahead = _AHEAD.pop(p.resolve(), None)
        if ahead is not None:
            with contextlib.suppress(Exception):   # its error, if any, is raised again below in this thread
                ahead.result()
    return _data_md5(p, skip_hidden)


def _data_md5(p: Path, skip_hidden: bool = False) -> str:
    if p.is_file():
        return file_md5(p)
    if not p.is_dir():
        raise MissingDataError(f"cannot hash {p}: no such file or directory")
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = [d for d in dirnames if d not in DVC_IGNORED and not (skip_hidden and d.startswith("."))]
        rel_dir = Path(dirpath).relative_to(p)
        for name in filenames:
            if name not in DVC_IGNORED and not (skip_hidden and name.startswith(".")):
                files[(rel_dir / name).as_posix()] = Path(dirpath) / name
    return files_md5(files)


_AHEAD: dict[Path, Any] = {}
"""Hashes started by hash_ahead, by resolved path, until a data_md5 of that path waits for one."""


def hash_ahead(path: str | Path) -> None:
    """Start `data_md5(path)` on a background thread and return at once: the next `data_md5` of the same path
    waits for it, then reads every file's md5 from the memo (`_HASHED`); any other path's hash, or a file changed
    since, is unaffected. hashlib releases the GIL, so the hash runs beside what the caller does next: the train
    stage's tail (its MLflow logging, plots) hashes the model the evaluate stage's cache key and lineage read; the
    evaluate stage scores the challenger while the downloaded champion is hashed. Each file is hashed once it has
    settled (`_stat_key`), so the memo keeps it."""
    import concurrent.futures
    import time

    p = Path(path).resolve()
    if p in _AHEAD or not p.exists():
        return

    def work() -> str:
        files = [p] if p.is_file() else [Path(d) / f for d, _, fs in os.walk(p) for f in fs]
        newest = max((f.stat().st_mtime_ns for f in files), default=0)
        wait = newest + _settle_ns(newest) - time.time_ns()
        if 0 < wait <= COARSE_SETTLE_NS:
            time.sleep(wait / 1e9)
        return _data_md5(p)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtrain-hash-ahead")
    _AHEAD[p] = pool.submit(work)
    pool.shutdown(wait=False)


GIT_SHA_ENV = "PACKTRAIN_GIT_SHA"
"""Images built without .git pass the sha of the source they were built from in this variable."""


def git_sha(root: str | Path | None = None) -> str | None:
    """HEAD of a git checkout: of `root` only, when given (None outside a checkout or without git); else of
    the current directory, then of packtrain's source tree, then $PACKTRAIN_GIT_SHA, else None.

    The one `git rev-parse HEAD` of packtrain: stage lineage, MLflow's `mlflow.source.git.commit`, the code
    version of the stage cache. The default lookup is cached per working directory (~5 ms a call).
    """
    if root is not None:
        return _rev_parse(str(root))
    return _default_sha(os.getcwd())


@functools.lru_cache(maxsize=8)
def _default_sha(cwd: str) -> str | None:
    for d in (cwd, str(Path(__file__).resolve().parent)):
        sha = _rev_parse(d)
        if sha:
            return sha
    return os.environ.get(GIT_SHA_ENV) or None


def _rev_parse(root: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def code_version() -> str:
    """`0.1.0+g<sha12>` when packtrain's own source sits in a git checkout, else the package version
    (an installed wheel: `0.1.0`; with $PACKTRAIN_GIT_SHA set, `0.1.0+g<sha12>` of it)."""
    import packtrain

    sha = _rev_parse(str(Path(packtrain.__file__).resolve().parent)) or os.environ.get(GIT_SHA_ENV)
    return f"{packtrain.__version__}+g{sha[:12]}" if sha else packtrain.__version__


def _git_toplevel(root: Path) -> Path | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


def ensure_dvc_repo(root: str | Path = ".", remote_dir: str | Path | None = None,
                    remote_name: str = "local") -> Path:
    """Make `root` a DVC repo with a default remote; idempotent. Returns the resolved root.

    - no `.dvc/`: `dvc init` — with `core.no_scm` when `root` is not inside a git work tree, `--subdir`
      when it is inside one but not at its top (like `dvc init`, this stages DVC's files in git);
    - adds remote `remote_name` → `remote_dir` (default `<root>/.packtrain/dvc-remote`, a local directory)
      unless a remote of that name exists, and makes it the default unless a default is already set
      (so an S3/GCS remote configured with `dvc remote add -d` is kept; see docs/data.md).
    """
    from dvc.repo import Repo

    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".dvc").is_dir():
        top = _git_toplevel(root)
        if top is None:
            Repo.init(str(root), no_scm=True)
        else:
            Repo.init(str(root), subdir=top != root)
    remote = Path(remote_dir).resolve() if remote_dir else root / ".packtrain" / "dvc-remote"
    remote.mkdir(parents=True, exist_ok=True)
    repo = Repo(str(root))
    try:
        with repo.config.edit("repo") as conf:
            if remote_name not in conf["remote"]:
                conf["remote"][remote_name] = {"url": str(remote)}
            if not conf["core"].get("remote"):
                conf["core"]["remote"] = remote_name
    finally:
        repo.close()
    return root


def dvc_repo_of(path: str | Path) -> Path | None:
    """The DVC repo that holds `path`: the nearest directory at or above it with a `.dvc/` (DVC's own
    `Repo.find_root`, which stops at a mount point), or None outside every DVC repo. A path that does not
    exist yet is looked up from its nearest existing parent.

        <checkout>/data              → <checkout>          (the repo `dvc repro` uses)
        /scratch/wd                  → None
    """
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    p = Path(path).resolve()
    while not p.is_dir() and p != p.parent:
        p = p.parent
    try:
        return Path(Repo.find_root(str(p)))
    except NotDvcRepoError:
        return None


def default_remote(root: str | Path) -> tuple[str, str] | None:
    """(name, url) of the default remote (`core.remote`) of DVC repo `root`, a local url resolved to an absolute
    path as DVC resolves it, credentials in the url masked; None when no default remote is set."""
    from dvc.repo import Repo

    repo = Repo(str(root))
    try:
        return _default_remote(repo)
    finally:
        repo.close()


def _default_remote(repo) -> tuple[str, str] | None:
    from packtrain.secrets import redact_uri

    name = repo.config["core"].get("remote")
    if not name:
        return None
    url = repo.config["remote"].get(name, {}).get("url")   # None: the default names no defined remote
    return name, str(redact_uri(str(url))) if url else f"(remote {name!r} is not defined)"


def push_file(path: str | Path, root: str | Path) -> dict:
    """Put one file into the DVC cache of repo `root` and push it to the repo's default remote: the objects
    `dvc add` + `dvc push` would store (`files/md5/<2>/<30>`), without a `.dvc` file, so neither the repo's
    tree nor its config changes (a `.dvc` file in the checkout's git-ignored `data/` is refused by DVC anyway).

    Returns {"md5", "pushed" (files sent: 0 when the remote has it already), "remote" (url; None: the repo has
    no default remote, the file is only cached)}. A failed push raises PacktrainError naming the remote.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc_data.hashfile.hash_info import HashInfo

    path = Path(path).resolve()
    md5 = file_md5(path)
    repo = Repo(str(root))
    try:
        remote = _default_remote(repo)
        repo.cache.local.add(str(path), _fs(), md5)   # a copy (or reflink): the cache entry is made read-only
        if remote is None:
            return {"md5": md5, "pushed": 0, "remote": None}
        try:
            result = repo.cloud.push([HashInfo("md5", md5)], remote=remote[0])
        except DvcException as e:
            raise PacktrainError(f"dvc push of {path} to remote {remote[0]} ({remote[1]}) failed: {e}") from None
        if result.failed:
            raise PacktrainError(f"dvc push of {path} to remote {remote[0]} ({remote[1]}) failed")
        return {"md5": md5, "pushed": len(result.transferred), "remote": remote[1]}
    finally:
        repo.close()


def push(paths: Iterable[str | Path], root: str | Path = ".", remote: str | None = None) -> int:
    """Push `paths` to the DVC remote (default remote unless `remote`); returns the number of files sent.

    A path that no `.dvc` file or `dvc.yaml` stage tracks yet is `dvc add`-ed first (writing `<path>.dvc`);
    a stage output (dvc.yaml) is pushed as recorded in dvc.lock.
    """
    from dvc.exceptions import DvcException, OutputNotFoundError
    from dvc.repo import Repo

    root = Path(root).resolve()
    if not (root / ".dvc").is_dir():
        raise MissingDataError(f"{root} is not a DVC repo: call ensure_dvc_repo first (or `dvc init`)")
    repo = Repo(str(root))
    try:
        targets = []
        for p in paths:
            path = (root / p).resolve() if not Path(p).is_absolute() else Path(p)
            if not path.exists():
                raise MissingDataError(f"cannot push {path}: it does not exist")
            try:
                repo.find_outs_by_path(str(path))
            except OutputNotFoundError:
                repo.add([str(path)])
            targets.append(str(path))
        try:
            return int(repo.push(targets=targets, remote=remote))
        except DvcException as e:
            raise PacktrainError(f"dvc push of {', '.join(targets)} failed: {e}") from None
    finally:
        repo.close()
