"""Lineage of a model version: which data, code, packing and hardware efficiency produced it.

The register stage tags every Model Registry version with values read from the upstream stages' JSON
(each one optional; what is missing is listed in the `missing_tags` tag and in register_result.json):

    tag               first match among                           in (order of preference)
    dataset_md5       input_md5, dataset_md5, dvc_md5             train_result.json, pack_stats.json
    git_sha           git_sha, git_commit, git_rev                train_result.json, then this checkout
    packing_fill      train.fill, fill, packing_fill              pack_stats.json, train_result.json
    mfu               useful_mfu, mfu                             train_result.json
    peak_memory_gib   peak_alloc_gib, peak_memory_gib,            train_result.json
                      cpu_peak_rss_gib (CPU runs)

A key matches a flattened (dotted) stats key equal to it or ending in `.<key>`, e.g. `fill` matches
`{"train": {"fill": 0.998}}` → `train.fill`. Nested sections are searched in the JSON's own order. A 0 for
mfu or peak memory (what a CPU run reports for CUDA numbers) counts as missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packtrain.config.base import flatten
from packtrain.errors import InputDataError

LINEAGE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # tag: (candidate keys, sources in order of preference)
    "dataset_md5": (("input_md5", "dataset_md5", "dvc_md5"), ("train_result", "pack_stats")),
    "git_sha": (("git_sha", "git_commit", "git_rev"), ("train_result",)),
    "packing_fill": (("train.fill", "fill", "packing_fill"), ("pack_stats", "train_result")),
    "mfu": (("useful_mfu", "mfu"), ("train_result",)),
    # CUDA peak; on CPU runs that is 0.0 and the process' peak RSS is the number that means something
    "peak_memory_gib": (("peak_alloc_gib", "peak_memory_gib", "cpu_peak_rss_gib"), ("train_result",)),
}
NONZERO = {"mfu", "peak_memory_gib"}
"""Tags for which a 0 means "not measured here" (MFU and CUDA memory on a CPU run): keep looking."""


def find_key(stats: dict | None, names: tuple[str, ...], nonzero: bool = False) -> tuple[str, Any] | None:
    """First (flat_key, value) whose flattened key equals or ends in `.name`, names tried in order;
    `nonzero` skips values equal to 0.

    >>> find_key({"train": {"fill": 0.99}, "eval": {"fill": 0.9}}, ("train.fill", "fill"))
    ('train.fill', 0.99)
    """
    if not stats:
        return None
    flat = flatten(stats)
    for name in names:
        for k, v in flat.items():
            if (k == name or k.endswith("." + name)) and v is not None and v != "":
                if nonzero and isinstance(v, (int, float)) and v == 0:
                    continue
                return k, v
    return None


def read_optional_json(path: str | Path | None) -> dict | None:
    """The JSON object at `path`, None when the file does not exist; a corrupt file is an InputDataError."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputDataError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputDataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def lineage_subset(stats: dict | None) -> dict:
    """The flat keys of `stats` any lineage tag could use (what run_evaluate copies from pack_stats.json)."""
    out = {}
    flat = flatten(stats or {})
    for names, _ in LINEAGE_KEYS.values():
        for name in names:
            out.update({k: v for k, v in flat.items() if k == name or k.endswith("." + name)})
    return out


def collect_lineage(sources: dict[str, dict | None], checkout_sha: str | None = None
                    ) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(values, origin, missing) for the tags of LINEAGE_KEYS from named stats dicts.

    `sources`: {"train_result": {...} | None, "pack_stats": {...} | None}. `origin[tag]` says where a
    value came from, e.g. "train_result:summary.useful_mfu"; `checkout_sha` fills git_sha last.
    """
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for tag, (names, order) in LINEAGE_KEYS.items():
        for src in order:
            hit = find_key(sources.get(src), names, nonzero=tag in NONZERO)
            if hit:
                values[tag], origin[tag] = hit[1], f"{src}:{hit[0]}"
                break
    if "git_sha" not in values and checkout_sha:
        values["git_sha"], origin["git_sha"] = checkout_sha, "checkout"
    missing = [t for t in LINEAGE_KEYS if t not in values]
    return values, origin, missing
