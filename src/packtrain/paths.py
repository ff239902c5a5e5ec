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

Publishing (every stage writes its outputs into a staging directory and swaps it in as one unit; files are
written by temp file + rename) lives in packtrain.publish; its names are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packtrain.publish import (  # noqa: F401  (re-exported: `from packtrain.paths import write_json` etc.)
    FAULT_ENV,
    STAGING_TAG,
    atomic_write_text,
    check_replaceable,
    clean_stale,
    output_target,
    publish_dir,
    replace_dir,
    staged_output,
    staging_dir,
    write_json,
)


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
