"""The one place that names where each stage reads and writes inside a run's `workdir`.

    <workdir>/
      ingest/documents.parquet        doc_id, text, source, n_chars        (+ ingest_result.json)
      (every stage's output is the directory <workdir>/<stage>/)
      validate/report.json            per-expectation result, offending doc_ids (+ data_docs/index.html)
      tokenize/                       tokenizer/ (AutoTokenizer-loadable), tokens.bin (uint32, flat),
                                      offsets.npy (int64, n_docs+1), doc_ids.npy (int64), split.npy
                                      (uint8: 0 train, 1 eval), tokenize_result.json
      pack/train/, pack/eval/         the pack store (packtrain.packing.store) + pack_result.json
      train/model/                    save_pretrained + tokenizer; train_result.json; checkpoints/
      evaluate/evaluate_result.json       loss, perplexity, tokens/s, peak memory; samples.json
      register/register_result.json   model name, version, alias decision
      mlflow.db                       the embedded MLflow store (when MLFLOW_TRACKING_URI is unset)

Adapters (CLI, KFP components, dvc.yaml, Airflow) pass explicit paths; these are only the defaults.

Outside any workdir, `user_cache_dir()` holds what one machine reuses across runs (the MLflow store template,
DeepSpeed's JIT-built ops): `$PACKTRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/packtrain`, else `~/.cache/packtrain`.

Paths read from files (a buffer line's `buffered_path`, a cache entry's output) are confined with
`confined_path` / `check_links_inside`: resolved (`..` and every symlink) and refused (PathOutsideError, exit 3)
unless they lie inside the directory that holds them.

Publishing (every stage writes its outputs into a staging directory and swaps it in as one unit; files are
written by temp file + rename) lives in packtrain.publish.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packtrain.errors import InputDataError


@dataclass(frozen=True)
class RunPaths:
    workdir: Path

    @property
    def documents(self) -> Path:
        return self.workdir / "ingest" / "documents.parquet"

    def stage_dir(self, stage: str) -> Path:
        return self.workdir / stage

    @property
    def validate_dir(self) -> Path:
        return self.workdir / "validate"

    @property
    def tokenize_dir(self) -> Path:
        return self.workdir / "tokenize"

    @property
    def pack_dir(self) -> Path:
        return self.workdir / "pack"

    @property
    def train_dir(self) -> Path:
        return self.workdir / "train"

    @property
    def model_dir(self) -> Path:
        return self.workdir / "train" / "model"

    @property
    def evaluate_dir(self) -> Path:
        return self.workdir / "evaluate"

    @property
    def register_dir(self) -> Path:
        return self.workdir / "register"

    @property
    def mlflow_db(self) -> Path:
        return self.workdir / "mlflow.db"


class PathOutsideError(InputDataError):
    """A path read from a file leads outside the directory it must stay in (exit 3)."""


def confined_path(path: str | Path, root: str | Path, what: str, allowed: str | None = None) -> Path:
    """`path` (relative to `root`, or absolute) fully resolved — `..` and every symlink on the way — when
    it lies strictly inside `root` (resolved the same way); else PathOutsideError naming `what`, the path
    as written, where it leads and what is allowed (`allowed` words a narrower rule the caller adds). The
    path itself need not exist.

    >>> # confined_path("artifacts/3f2a/model", "/buf", "buffered_path")      → /buf/artifacts/3f2a/model
    >>> # confined_path("../victim/x", "/buf", "buffered_path")
    >>> #   PathOutsideError: buffered_path '../victim/x' leads to /victim/x, outside /buf (allowed: a path
    >>> #   inside /buf, after resolving '..' and symbolic links)
    """
    real_root = Path(os.path.realpath(root))
    raw = Path(path)
    real = Path(os.path.realpath(raw if raw.is_absolute() else Path(root) / raw))
    if real_root not in real.parents:
        allowed = allowed or f"a path inside {real_root}"
        raise PathOutsideError(f"{what} {str(path)!r} leads to {real}, outside {real_root} (allowed: {allowed}, "
                               f"after resolving '..' and symbolic links)")
    return real


def check_links_inside(tree: str | Path, root: str | Path, what: str, allowed: str | None = None) -> None:
    """Every symbolic link under the directory `tree` (not followed while walking) must lead inside `root`;
    else PathOutsideError naming the link. A file `tree` has nothing to check. Cost: one lstat per entry."""
    tree = Path(tree)
    if not tree.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if entry.is_symlink():
                confined_path(entry, root, f"{what}: symbolic link", allowed)


def user_cache_dir() -> Path:
    """`$PACKTRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/packtrain`, else `~/.cache/packtrain` (module doc)."""
    if os.environ.get("PACKTRAIN_CACHE_DIR"):
        return Path(os.environ["PACKTRAIN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "packtrain"


def run_paths(workdir: str | Path) -> RunPaths:
    return RunPaths(Path(workdir))


@contextlib.contextmanager
def patched_env(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables inside the block; restore them after."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
