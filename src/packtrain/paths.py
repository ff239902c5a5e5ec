"""The one place that names where each stage reads and writes inside a run's `workdir`.

    <workdir>/
      ingest/documents.parquet        doc_id, text, source, n_chars        (+ ingest_stats.json)
      (every stage's output is the directory <workdir>/<stage>/)
      validate/report.json            per-expectation result, offending doc_ids (+ data_docs/index.html)
      tokenize/                       tokenizer/ (AutoTokenizer-loadable), tokens.bin (uint32, flat),
                                      offsets.npy (int64, n_docs+1), doc_ids.npy (int64), split.npy
                                      (uint8: 0 train, 1 eval), stats.json
      pack/train/, pack/eval/         the pack store (packtrain.packing.store) + pack_stats.json
      train/model/                    save_pretrained + tokenizer; train_result.json; checkpoints/
      evaluate/eval_result.json       loss, perplexity, tokens/s, peak memory; samples.json
      register/register_result.json   model name, version, alias decision
      mlflow.db                       the embedded MLflow store (when MLFLOW_TRACKING_URI is unset)

Adapters (CLI, KFP components, dvc.yaml, Airflow) pass explicit paths; these are only the defaults.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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


def run_paths(workdir: str | Path) -> RunPaths:
    return RunPaths(Path(workdir))


def atomic_write_text(path: Path, text: str) -> None:
    """Write via temp file + rename so a crash never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, obj) -> None:
    import json

    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def replace_dir(tmp: Path, root: Path) -> None:
    """Move a finished temp directory into place, replacing `root` (old copy renamed away first), so readers
    never see a half-written directory."""
    if root.exists():
        old = root.with_name(f".{root.name}.old")
        if old.exists():
            shutil.rmtree(old)
        root.rename(old)
        tmp.rename(root)
        shutil.rmtree(old)
    else:
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(root)


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
