"""DVC metrics and plots from a stage's output directory (`packtrain pipeline export STAGE`, used in dvc.yaml).

DVC forbids a metrics file inside a stage's output directory (overlapping outputs), and its plots read
.json/.yaml/.csv/.tsv but not JSON lines. So after each stage dvc.yaml calls this to write, next to the
data and committed to git (`cache: false`):

    metrics/<stage>.json      the stage's stats JSON (numbers only: DVC metrics show/diff ignore the rest)
    plots/train_steps.csv     train only: step, loss, lr, grad_norm, step_time_s, real_tokens (train_log.jsonl)

    STATS_FILES["pack"] == "pack_stats.json"   # the file each stage runner writes into its output dir
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from packtrain.errors import MissingDataError
from packtrain.paths import atomic_write_text, write_json

STATS_FILES = {
    "ingest": "ingest_stats.json",
    "validate": "validate_stats.json",
    "tokenize": "stats.json",
    "pack": "pack_stats.json",
    "train": "train_result.json",
    "evaluate": "eval_result.json",
    "register": "register_result.json",
}
TRAIN_LOG = "train_log.jsonl"
PLOT_COLUMNS = ("step", "loss", "lr", "grad_norm", "step_time_s", "real_tokens")


def numeric_tree(d):
    """Keep numbers (and booleans as 0/1) and the dicts that contain them: what `dvc metrics` shows.

    >>> numeric_tree({"fill": 0.99, "strategy": "bfd", "eval": {"n_packs": 3, "path": "x"}})
    {'fill': 0.99, 'eval': {'n_packs': 3}}
    """
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, dict):
            sub = numeric_tree(v)
            if sub:
                out[k] = sub
    return out


def export_stage(stage: str, stage_dir: str | Path, metrics_dir: str | Path = "metrics",
                 plots_dir: str | Path = "plots") -> list[Path]:
    """Write metrics/<stage>.json (and plots/train_steps.csv for train); returns the files written."""
    if stage not in STATS_FILES:
        raise MissingDataError(f"unknown stage {stage!r} (stages: {', '.join(STATS_FILES)})")
    src = Path(stage_dir) / STATS_FILES[stage]
    if not src.is_file():
        raise MissingDataError(f"{src} does not exist: run `packtrain {stage}` first (or pass --dir DIR)")
    stats = json.loads(src.read_text(encoding="utf-8"))
    written = [Path(metrics_dir) / f"{stage}.json"]
    write_json(written[0], numeric_tree(stats))
    log = Path(stage_dir) / TRAIN_LOG
    if stage == "train" and log.is_file():
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=PLOT_COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for line in log.read_text(encoding="utf-8").splitlines():
            if line.strip():
                w.writerow(json.loads(line))
        written.append(Path(plots_dir) / "train_steps.csv")
        atomic_write_text(written[-1], buf.getvalue())
    return written
