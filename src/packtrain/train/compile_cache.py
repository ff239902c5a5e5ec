"""torch.compile's on-disk caches under the run's workdir, so that the next run of a recipe on a fresh host (an
empty /tmp, as every pod of a cluster starts with) loads its compiled graphs instead of compiling them again.

    <workdir>/compile-cache/<key>/          TORCHINDUCTOR_CACHE_DIR: inductor's FX graph and AOTAutograd caches
                                            (fxgraph/, aotautograd/), the generated code and kernels, autotuning
                                            results, dynamo's recorded dynamic-shape decisions
    <workdir>/compile-cache/<key>/triton/   TRITON_CACHE_DIR: compiled Triton kernels (inductor's and Liger's)
    <workdir>/compile-cache/<key>/packtrain_manifest.json   size, mtime, sha256 of each file a stage left
    key                                     torch-2.11.0+cu128-triton-3.5.0-cuda, torch-2.13.0+cpu-cpu

Why: inductor's default cache is /tmp/torchinductor_<user>. The 350m-h200 train stage's first step took 9.9 s
on a host whose /tmp was empty and 2.9 s on the next run there (bench/results/gpu_pipeline_350m.json: compile
9.8 s → 2.8 s; the evaluate stage's compiled warm-up 1.7 s → 0.5 s); on a cluster every run was the first.

    workdir_compile_cache(workdir, device_type)   the train and evaluate stages run inside it: sets the two
                                                  variables for the stage (put back after it), checks the files
                                                  against the manifest first and writes it after a stage that
                                                  succeeded, counts cache hits and misses
    CompileCache.verdict()                        "hit" | "miss" | "partial" | "off" (nothing went through the
                                                  caches: compile off, a non-inductor backend); the stages
                                                  record it as timings.compile_cache

What inductor keys each entry on stays its own (the graph, a hash of torch's sources, the GPU's name, the CUDA and
Triton versions, the inductor config): an entry from another GPU or install is never loaded. The key directory only
keeps one install's entries apart from another's, so an upgrade starts an empty directory and the old one can be
deleted whole. A damaged entry is not torch's problem alone: a truncated pickled entry is a miss to it (a warning,
then it compiles), but a damaged generated module or kernel it would load as it is and fail the run. So a stage
first removes every file that differs from the manifest (torch compiles or writes it again): another size, or
another modification time and another sha256 (a copied cache keeps its contents, not its times). Files the manifest
does not list (a stage that did not finish) are kept: torch writes each file whole (temp file + rename). Checking
costs a stat per file, plus a read of those whose time changed (sha256, ~1 GB/s).

A user's setting wins: TORCHINDUCTOR_CACHE_DIR set → nothing is set, checked or written (inductor keeps Triton's
kernels under it); TRITON_CACHE_DIR set → kept. Inductor writes its own default (/tmp/torchinductor_<user>) into the
environment when it is first imported (an earlier stage in the same process, or the parent process of a KFP-local
stage), so that value counts as unset. A container run passes neither variable in (packtrain.pipeline.containers
passes PACKTRAIN_* only): its stages use the workdir's cache, the workdir being mounted at its own path. Still
outside the workdir, as before: inductor's precompiled C++ headers on a CPU host (/tmp/torchinductor_<user>/
precompiled_headers, ~150 MB, placed at its import), which a fresh CPU host builds again even on a hit (~15 s on
2 cores; a CUDA run has none).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packtrain.paths import patched_env

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
MANIFEST = "packtrain_manifest.json"
Verdict = Literal["hit", "miss", "partial", "off"]

# torch._dynamo.utils.counters: (group, name) of each cache's lookups. A graph that inductor refuses to cache
# ("bypass": it holds something unpicklable) is compiled every time: a miss for the verdict.
_HITS = (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit"))
_MISSES = (("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
           ("aot_autograd", "autograd_cache_miss"), ("aot_autograd", "autograd_cache_bypass"))


def compile_cache_root(workdir: str | Path) -> Path:
    """<workdir>/compile-cache (beside the stage cache, <workdir>/cache: no stage entry, no stage key)."""
    return Path(workdir).resolve() / "compile-cache"


def install_key(device_type: str) -> str:
    """The key directory's name: torch's version, Triton's where it is installed (CUDA hosts), the device type.

    >>> # install_key("cuda") → 'torch-2.11.0+cu128-triton-3.5.0-cuda'; install_key("cpu") → 'torch-2.13.0+cpu-cpu'
    """
    import importlib.metadata

    import torch

    parts = [f"torch-{torch.__version__}"]
    if device_type == "cuda":
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            parts.append(f"triton-{importlib.metadata.version('triton')}")
    return "-".join([*parts, device_type]).replace("/", "_")


def device_type(requested: str) -> str:
    """"cuda" unless `requested` is "cpu" or no GPU is visible (the device a stage's "auto"/"cuda" resolves to;
    a "cuda" without one is refused by the stage itself)."""
    import torch

    return "cuda" if requested != "cpu" and torch.cuda.is_available() else "cpu"


def inductor_default_dir() -> str:
    """Inductor's own default cache directory, by its rule (torch._inductor.runtime.cache_dir_utils.
    default_cache_dir; importing inductor to ask would cost ~3 s of a stage that compiles nothing):
    <tempfile.gettempdir()>/torchinductor_<user> ($TMPDIR when set, else /tmp)."""
    import getpass
    import re
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.abspath(os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)))


@dataclass(frozen=True)
class CacheDirs:
    """Where a stage's compile caches are, and whose choice each is."""

    inductor: str
    triton: str                      # "inductor": its default for its kernels, <inductor>/triton/<device index>
    source: Literal["workdir", "user"]
    triton_source: Literal["workdir", "user", "inductor"]


def choose_dirs(workdir: str | Path, device: str, environ: Mapping[str, str], default_dir: str) -> CacheDirs:
    """The directories a stage uses (module doc: a user's setting wins; inductor's own default counts as unset).

    >>> d = choose_dirs("/w", "cpu", {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_me"}, "/tmp/torchinductor_me")
    >>> d.source, d.inductor.startswith("/w/compile-cache/torch-"), d.triton_source
    ('workdir', True, 'workdir')
    >>> d = choose_dirs("/w", "cpu", {"TORCHINDUCTOR_CACHE_DIR": "/scratch/ind"}, "/tmp/torchinductor_me")
    >>> d.inductor, d.source, d.triton, d.triton_source
    ('/scratch/ind', 'user', '/scratch/ind/triton', 'inductor')
    """
    own = str(compile_cache_root(workdir) / install_key(device))
    current = environ.get(INDUCTOR_ENV)
    triton = environ.get(TRITON_ENV)
    if current is not None and os.path.abspath(current) not in (os.path.abspath(default_dir), own):
        inductor = os.path.abspath(current)
        if triton:
            return CacheDirs(inductor, triton, "user", "user")
        return CacheDirs(inductor, os.path.join(inductor, "triton"), "user", "inductor")
    own_triton = os.path.join(own, "triton")
    if triton and os.path.abspath(triton) != own_triton:
        return CacheDirs(own, triton, "workdir", "user")
    return CacheDirs(own, own_triton, "workdir", "workdir")


def cache_counts() -> dict[str, int]:
    """This process's cache lookups so far (cumulative: compare two readings); {} before dynamo is imported."""
    if "torch._dynamo" not in sys.modules:
        return {}
    from torch._dynamo.utils import counters

    return {f"{g}.{n}": int(counters[g][n]) for g, n in (*_HITS, *_MISSES) if counters[g][n]}


def verdict(before: Mapping[str, int], after: Mapping[str, int]) -> Verdict:
    """What the lookups between two readings of `cache_counts` found.

    >>> verdict({}, {"inductor.fxgraph_cache_hit": 2, "aot_autograd.autograd_cache_hit": 1})
    'hit'
    >>> verdict({"inductor.fxgraph_cache_hit": 2}, {"inductor.fxgraph_cache_hit": 2, "inductor.fxgraph_cache_miss": 1})
    'miss'
    >>> verdict({}, {"inductor.fxgraph_cache_hit": 1, "inductor.fxgraph_cache_miss": 1}), verdict({}, {})
    ('partial', 'off')
    """
    def new(keys: tuple[tuple[str, str], ...]) -> int:
        return sum(max(after.get(f"{g}.{n}", 0) - before.get(f"{g}.{n}", 0), 0) for g, n in keys)

    hits, misses = new(_HITS), new(_MISSES)
    if not hits and not misses:
        return "off"
    return "hit" if not misses else "miss" if not hits else "partial"


def _cache_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file a manifest covers: not the manifest, not locks/, not torch's temp
    files (`.<pid>.<thread>.tmp`) or other dotfiles."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (d == "locks" or d.startswith("."))]
        for name in filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel != MANIFEST and not name.startswith(".") and p.is_file() and not p.is_symlink():
                yield rel, p


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_manifest(root: Path) -> dict[str, list]:
    """root/MANIFEST's files, {relative path: [size, mtime_ns, sha256]}; {} when it is missing or unreadable."""
    try:
        files = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return files if isinstance(files, dict) else {}


def _matches(p: Path, want: list) -> bool:
    """Whether `p` is the file `want` ([size, mtime_ns, sha256]) records: same size, then the same modification
    time (a stat: untouched since it was sealed) or else the same sha256 (a copied cache has new times)."""
    try:
        st = p.stat()
        if st.st_size != want[0]:
            return False
        return st.st_mtime_ns == want[1] or _digest(p) == want[2]
    except (OSError, IndexError, TypeError):
        return False


def remove_damaged(root: Path, listed: Mapping[str, list]) -> list[str]:
    """Remove the files that differ from what the manifest `listed` records (torch writes them again); the
    relative paths removed. Files it does not list are kept (module doc)."""
    removed = []
    for rel, p in _cache_files(root):
        if rel in listed and not _matches(p, listed[rel]):
            p.unlink(missing_ok=True)
            removed.append(rel)
    return removed


def seal(root: Path, listed: Mapping[str, list]) -> int:
    """Write root/MANIFEST for every cache file now (a file `listed` records unchanged keeps its sha256; a new or
    changed one is read); returns how many it lists (none: no manifest is written)."""
    from packtrain.publish import write_json

    files = {}
    for rel, p in _cache_files(root):
        st = p.stat()
        want = listed.get(rel)
        same = want is not None and want[:2] == [st.st_size, st.st_mtime_ns]
        files[rel] = [st.st_size, st.st_mtime_ns, want[2] if same and want else _digest(p)]
    if files or listed:
        write_json(root / MANIFEST, {"files": files})
    return len(files)


@dataclass
class CompileCache:
    """The directories in effect for a stage and the cache lookups it made (read `timings()` at its end)."""

    dirs: CacheDirs
    removed: list[str] = field(default_factory=list)   # damaged files removed before the stage
    check_s: float = 0.0                                # seconds the check against the manifest took
    _start: dict[str, int] = field(default_factory=cache_counts)

    def verdict(self) -> Verdict:
        return verdict(self._start, cache_counts())

    def timings(self) -> dict[str, str | float]:
        """What a stage's timings record: compile_cache (the verdict), compile_cache_dir, compile_cache_check_s."""
        return {"compile_cache": self.verdict(), "compile_cache_dir": self.dirs.inductor,
                "compile_cache_check_s": round(self.check_s, 3)}

    def line(self, stage: str) -> str:
        """`[packtrain] train: compile cache hit: <dir> (the workdir's; TORCHINDUCTOR_CACHE_DIR picks another)`."""
        whose = ("the workdir's; TORCHINDUCTOR_CACHE_DIR picks another" if self.dirs.source == "workdir"
                 else "TORCHINDUCTOR_CACHE_DIR, the user's")
        if self.dirs.triton_source == "user":
            whose += f"; Triton's kernels: {self.dirs.triton} (TRITON_CACHE_DIR)"
        if self.removed:
            whose += f"; {len(self.removed)} damaged file(s) removed first"
        return f"[packtrain] {stage}: compile cache {self.verdict()}: {self.dirs.inductor} ({whose})"


@contextlib.contextmanager
def workdir_compile_cache(workdir: str | Path, device: str) -> Iterator[CompileCache]:
    """Point inductor's and Triton's caches at the workdir's for the duration (module doc), unless the user
    pointed them elsewhere; the environment is put back afterwards (a later run in the same process, with another
    workdir, chooses again). Child processes started inside (torchrun's ranks) inherit the choice. The workdir's
    cache is checked against its manifest first and sealed after a stage that succeeded. Nothing is written where
    nothing compiled (inductor itself makes the empty directory when it is imported)."""
    dirs = choose_dirs(workdir, device, os.environ, inductor_default_dir())
    root = Path(dirs.inductor)
    own = dirs.source == "workdir"
    t0 = time.perf_counter()
    listed = read_manifest(root) if own else {}
    cache = CompileCache(dirs, remove_damaged(root, listed) if listed else [])
    cache.check_s = time.perf_counter() - t0
    env = {k: os.environ.get(k) for k in (INDUCTOR_ENV, TRITON_ENV)}   # both put back after, whoever set them
    if own:
        env[INDUCTOR_ENV] = dirs.inductor
    if dirs.triton_source == "workdir":
        env[TRITON_ENV] = dirs.triton
    with patched_env(**env):
        yield cache
        if own and root.is_dir():
            seal(root, listed)
