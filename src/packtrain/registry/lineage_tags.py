"""Lineage of a model version: which data, code, tokenizer, packing and hardware efficiency produced it.

The register stage tags every Model Registry version with values read from the typed results of the
upstream stages (packtrain.stages.results), one declared key each; what is missing is listed in the
`missing_tags` tag and in register_result.json:

    tag               read from (first source that has it)
    dataset_md5       train_result.json lineage.data_version, evaluate_result.json lineage.data_version
    git_sha           train_result.json lineage.git_sha, evaluate_result.json lineage.git_sha, then this
                      checkout (packtrain.versioning.git_sha)
    code_version      train_result.json lineage.code_version, evaluate_result.json lineage.code_version
    tokenizer_hash    train_result.json lineage.tokenizer_hash, evaluate_result.json lineage.tokenizer_hash
    packing_fill      train_result.json packing_fill (fill of the train packs it was trained on)
    mfu               train_result.json throughput.useful_mfu (0 on a CPU run: missing)
    peak_memory_gib   train_result.json TrainResult.peak_memory_gib (memory.peak_alloc_gib; on a CPU run,
                      where CUDA numbers are 0, memory.cpu_peak_rss_gib)

train_result.json is optional (register --train DIR); when present it must parse as a TrainResult
(InputDataError naming the file and the key otherwise), as evaluate_result.json's "lineage" must parse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packtrain.errors import InputDataError
from packtrain.stages.lineage import Lineage, read_json_file
from packtrain.stages.results import EvaluateResult, TrainResult

LINEAGE_TAGS = ("dataset_md5", "git_sha", "code_version", "tokenizer_hash", "packing_fill", "mfu",
                "peak_memory_gib")
"""Every lineage tag of a model version, in the order `missing` lists them."""

_FROM_LINEAGE = {"dataset_md5": "data_version", "git_sha": "git_sha", "code_version": "code_version",
                 "tokenizer_hash": "tokenizer_hash"}


def read_optional_json(path: str | Path | None) -> dict | None:
    """The JSON object at `path`, None when the file does not exist; a corrupt file is an InputDataError."""
    if path is None or not Path(path).is_file():
        return None
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise InputDataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _train_result(train: TrainResult | dict | None, source: str | Path | None) -> TrainResult | None:
    if train is None or isinstance(train, TrainResult):
        return train
    return TrainResult.from_dict(train, str(source) if source else TrainResult.FILE)


def _eval_lineage(evaluation: EvaluateResult | dict | None, source: str | Path | None) -> Lineage | None:
    """The evaluation's lineage; an evaluation dict without one (the library's EvalStats) has none."""
    if evaluation is None:
        return None
    if isinstance(evaluation, EvaluateResult):
        return evaluation.lineage
    raw = evaluation.get("lineage")
    return None if raw is None else Lineage.from_dict(raw, str(source) if source else EvaluateResult.FILE)


def collect_lineage(train: TrainResult | dict | None, evaluation: EvaluateResult | dict | None = None,
                    checkout_sha: str | None = None, train_source: str | Path | None = None,
                    eval_source: str | Path | None = None) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(values, origin, missing) for LINEAGE_TAGS (module doc).

    `train`: the TrainResult or train_result.json's dict (None: no train result); `evaluation`: the
    EvaluateResult or evaluate_result.json's dict. `origin[tag]` says where a value came from, e.g.
    "train_result:lineage.data_version"; `checkout_sha` fills git_sha last ("checkout"). `*_source` name the
    files in errors.

    >>> lin = Lineage(git_sha=None, code_version="0.1.0", input_md5={}, data_version="5d41", tokenizer_hash=None)
    >>> collect_lineage(None, {"lineage": lin.to_dict()}, checkout_sha="abc")[0]
    {'dataset_md5': '5d41', 'git_sha': 'abc', 'code_version': '0.1.0'}
    """
    tr = _train_result(train, train_source)
    ev = _eval_lineage(evaluation, eval_source)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for tag, key in _FROM_LINEAGE.items():
        for name, lin in (("train_result", tr.lineage if tr else None), ("eval_result", ev)):
            value = getattr(lin, key) if lin is not None else None
            if value:
                values[tag], origin[tag] = value, f"{name}:lineage.{key}"
                break
    if "git_sha" not in values and checkout_sha:
        values["git_sha"], origin["git_sha"] = checkout_sha, "checkout"
    if tr is not None:
        measured = {"packing_fill": (tr.packing_fill, "packing_fill"),
                    "mfu": (tr.throughput.get("useful_mfu") or None, "throughput.useful_mfu"),
                    "peak_memory_gib": (tr.peak_memory_gib, "peak_memory_gib")}
        for tag, (value, key) in measured.items():
            if value is not None:
                values[tag], origin[tag] = value, f"train_result:{key}"
    ordered = {t: values[t] for t in LINEAGE_TAGS if t in values}
    return ordered, origin, [t for t in LINEAGE_TAGS if t not in values]
